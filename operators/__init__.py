"""Thin Airflow operators over imgest's core functions."""
