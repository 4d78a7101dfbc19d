"""A Spark job submitted by a holder of the dataset's lock (run_submit, as the CLI submits) fences its publishing in
the driver with that lock: submitted after the holder's lease ran out and another run took the lock over, the files
job writes its images but publishes nothing, and its last line names the new holder. It goes through spark-submit
(not the suite's reused driver): the lock holder reaches the driver in spark-submit's environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from imgest.core import locks
from imgest.core.lock_stores import FileLockStore
from imgest.sources.devdata.sample import SampleSpec, write_sample
from imgest.sources.scan import scan_to_dir
from imgest.spark.failures import last_error_sentence
from imgest.spark.submit import run_submit, submit_command
from tests.jobs.conftest import MASTER
from tests.lock_wait import take_over

pytestmark = [pytest.mark.services, pytest.mark.slow]


def test_a_driver_of_a_lost_lock_publishes_nothing(tmp_path: Path) -> None:
    write_sample(tmp_path / "src", SampleSpec("imagefolder", classes=2, per_class=4, val_per_class=1, seed=5))
    scan_to_dir(tmp_path / "src", tmp_path / "m", dataset="fencejob")
    dest, log = tmp_path / "files", tmp_path / "job.log"
    args = ["--manifest-dir", str(tmp_path / "m"), "--dest", str(dest), "--summary-json", str(tmp_path / "s.json")]
    store = FileLockStore(tmp_path / "locks")
    first = locks.cli_holder("imgest ingest files", lease_s=0.3)
    assert locks.try_acquire("fencejob", first, store) is None
    with locks.holding("fencejob", first, store):  # what dataset_lock registers for the CLI's command
        second = locks.airflow_holder("ingest_imagenet", "manual__other", lease_s=600)
        take_over("fencejob", second, store)  # stalled past its lease: another run takes the lock over
        rc = run_submit(submit_command("write_files", args, MASTER), log, reuse=False)  # spark-submit's environment
    assert rc != 0
    sentence = last_error_sentence(log) or ""
    assert "lost the write lock of dataset 'fencejob'" in sentence, log.read_text()[-3000:]
    assert "held by Airflow DAG ingest_imagenet run manual__other" in sentence
    assert not (dest / "manifest.json").exists()  # the job's staged version was never published
    assert not (dest / "v").exists()
