"""Peers: other projects' tools that imgest is measured against and must interoperate with."""
