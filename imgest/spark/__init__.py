"""spark-submit of imgest's jobs and the job options they share with the CLI and the DAG."""
