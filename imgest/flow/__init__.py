"""The DAG's steps as ordinary functions, the typed ingest request, and the demo."""
