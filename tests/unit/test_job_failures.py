"""A failed job's first line: the worker's imgest error or Spark's summary, dug out of a Py4J error's text."""

from __future__ import annotations

from pathlib import Path

import pytest

from imgest.core.errors import ConfigError
from imgest.spark.failures import failure_sentence, last_error_sentence

PY4J_WORKER_ERROR = """An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 1 in stage 2.0 failed 4 times
\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(DAGScheduler.scala:2898)
Traceback (most recent call last):
  File "/work/imgest/sinks/cassandra/writer.py", line 120, in write
    raise CassandraWriteError(msg)
imgest.sinks.cassandra.writer.CassandraWriteError: Cassandra at 127.0.0.1:9042 stopped answering after 5 retries
\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:572)
"""
PY4J_CRASH = """An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 3 in stage 1.0 failed 1 times, most \
recent failure: Lost task 3.0: org.apache.spark.SparkException: Python worker exited unexpectedly (crashed)
\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator$$anonfun$1.applyOrElse(PythonRunner.scala:612)
Caused by: java.io.EOFException
"""


class Py4JJavaError(Exception):
    """Stands in for py4j's error type: only its text matters here."""


def test_the_workers_imgest_error_is_the_sentence() -> None:
    sentence = failure_sentence(Py4JJavaError(PY4J_WORKER_ERROR))
    assert sentence == "Cassandra at 127.0.0.1:9042 stopped answering after 5 retries"


def test_sparks_summary_when_no_imgest_error() -> None:
    assert failure_sentence(Py4JJavaError(PY4J_CRASH)).startswith("Job aborted due to stage failure: Task 3")


def test_imgest_errors_are_their_own_sentence() -> None:
    assert failure_sentence(ConfigError("keyspace 'x' is bad")) == "keyspace 'x' is bad"


def test_last_error_line_of_a_job_log(tmp_path: Path) -> None:
    log = tmp_path / "spark.log"
    log.write_text(
        "2026-01-01 00:00:00,000 INFO imgest.jobs.pack_shards: packing 6 samples\n"
        "\tat org.apache.spark.Foo(Foo.scala:1)\n"
        "2026-01-01 00:00:01,000 ERROR imgest.jobs.pack_shards: packing failed: nothing was ingestible: all 6\n"
    )
    assert last_error_sentence(log) == "packing failed: nothing was ingestible: all 6"
    assert last_error_sentence(tmp_path / "missing.log") is None


def test_a_session_that_fails_to_start_gives_back_the_held_compaction(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Cassandra job claims its version while the Spark session starts (claim_while_spark_starts). A session
    that cannot start (a fault injected here: a broken Spark install) leaves no table with compaction held; a claim
    that fails is raised as the claim's error."""
    import imgest.spark.submit as submit
    from imgest.core.phases import PhaseClock
    from imgest.sinks.cassandra.claimed import Claimed
    from jobs import ingest_cassandra as job

    given_back: list[list[str]] = []

    def claimed(held: list[str]) -> Claimed:
        return Claimed("cfg", [], ["train"], None, "path", None, held)  # type: ignore[arg-type]

    monkeypatch.setattr(job, "claim", lambda args: claimed(["ks.data", "ks.metadata"]))
    monkeypatch.setattr(job, "give_compaction_back", lambda cfg, held: given_back.append(held))

    def broken(name: str) -> None:
        raise RuntimeError("Java gateway process exited before sending its port number")

    monkeypatch.setattr(submit, "build_context", broken)
    with pytest.raises(RuntimeError, match="Java gateway"):
        job.claim_while_spark_starts(None, PhaseClock())  # type: ignore[arg-type]
    assert given_back == [["ks.data", "ks.metadata"]]

    def refused(*_: object) -> None:
        raise ConfigError("Cassandra refused the login")

    monkeypatch.setattr(job, "claim", refused)
    monkeypatch.setattr(submit, "build_context", lambda name: "spark")
    with pytest.raises(ConfigError, match="refused the login"):
        job.claim_while_spark_starts(None, PhaseClock())  # type: ignore[arg-type]
    assert given_back == [["ks.data", "ks.metadata"]]  # nothing held, nothing given back

    monkeypatch.setattr(job, "claim", lambda args: claimed([]))
    phases = PhaseClock()
    spark, got = job.claim_while_spark_starts(None, phases)  # type: ignore[arg-type]
    assert (spark, got) == ("spark", claimed([]))
    assert set(phases.laps) == {"spark_session", "schema_and_claim"}
