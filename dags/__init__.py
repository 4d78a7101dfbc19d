"""Airflow DAGs of imgest: wiring only (shipped as imgest.dags)."""
