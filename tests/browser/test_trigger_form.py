"""The `ingest_imagenet` trigger form in a real browser, as a new user meets it, against Airflow as it is deployed
(PostgreSQL, the scheduler, two Celery workers that share only the stores: `imgest services up airflow-celery`).

Each run is triggered from the form and executed by the scheduler on the workers (Spark in local[*]); a run of
the generated sample finds it on whichever worker a task lands (each generates the same bytes); the tests read
the outcome from the UI: the run page's task states, the validate task's log, the dialog's error, the Assets view.
"""

from __future__ import annotations

from urllib.parse import quote

import pytest

from imgest.core import defaults
from imgest.flow.request import SECTIONS
from imgest.services import CassandraServer
from tests.browser.airflow_ui import DAG_ID, AirflowUI

pytestmark = [pytest.mark.browser, pytest.mark.services, pytest.mark.slow]

COMMON = ("validate", "scan", "choose_target", "build_split", "read_throughput", "publish_asset")
BRANCH = {
    "cassandra": ("prepare_cassandra", "ingest_cassandra", "verify_cassandra"),
    "shards": ("prepare_bucket", "ingest_shards", "verify_shards"),
    "files": ("ingest_files", "verify_files"),
}
SPARK_TASKS = ("ingest_cassandra", "ingest_shards", "ingest_files")


def _assert_target_ran(states: dict[str, str], target: str) -> None:
    for task in (*COMMON, *BRANCH[target]):
        assert states[task] == "success", (task, states)
    for other in BRANCH.keys() - {target}:
        for task in BRANCH[other]:
            assert states[task] == "skipped", (task, states)
    assert states["validate_xnvme"] == "skipped"  # the xNVMe check reads the files target only


def test_form_opens_valid_with_sections_in_order(ui: AirflowUI) -> None:
    form = ui.open_trigger_form()
    assert form.sections() == [*SECTIONS, "Advanced Options"]
    assert form.submit_button().is_enabled()
    assert form.dialog.get_by_text("This field is required").count() == 0
    ui.shot("form-closed", form.dialog)
    for section in SECTIONS:
        form.open_section(section)
        assert form.dialog.get_by_text("This field is required").count() == 0, section
        ui.shot(f"form-{section.lower()}", form.dialog)
    form.open_section("Source")
    assert form.field("Source dataset").input_value() == ""
    assert not form.field("Use the generated sample").is_checked()


def test_dag_and_task_docs_are_shown(ui: AirflowUI) -> None:
    ui.open_dag()
    ui.page.get_by_role("button", name="Dag Docs").click()
    docs = ui.page.get_by_role("dialog")
    docs.get_by_text("Ingest an ImageNet-style dataset").wait_for()
    text = docs.inner_text()
    for part in ("cassandra", "shards", "fn.readers.webdataset", "split-cassandra.npz", "manifest.json"):
        assert part in text, part
    ui.shot("dag-docs", docs)
    ui.page.goto(f"{ui.base_url}/dags/{DAG_ID}/tasks/validate")
    ui.page.get_by_role("button", name="Documentation").click()
    task_docs = ui.page.get_by_role("dialog")
    task_docs.get_by_text("Checks every setting together").wait_for()
    assert "no Spark" in task_docs.inner_text()
    ui.shot("task-docs-validate", task_docs)


def test_sample_with_defaults_runs_green(ui: AirflowUI, cassandra_server: CassandraServer) -> None:
    """The default target with every default, run by the scheduler; the shard target's run through the DAG is
    tests/dags/test_ingest_dag.py's, and the form's switches reaching the run's conf is the next test's."""
    target = defaults.TARGET
    form = ui.open_trigger_form()
    form.open_section("Source")
    form.switch_on("Use the generated sample")
    ui.shot(f"form-sample-{target}", form.dialog)
    run_id = form.submit()
    assert ui.wait_for_run(run_id) == "success"
    _assert_target_ran(ui.task_states(run_id), target)
    read = ui.api(f"dags/{DAG_ID}/dagRuns/{quote(run_id)}/taskInstances/read_throughput/xcomEntries/return_value")
    assert "read_check is off" not in str(read["value"]), read
    ui.shot(f"run-{target}")
    expected = f"cassandra://{cassandra_server.host}:{cassandra_server.native_port}/{defaults.KEYSPACE}/data"
    assert ui.wait_for_asset(expected).is_visible()
    ui.shot(f"assets-{target}")


def test_crop_larger_than_resize_fails_validate_with_its_message(ui: AirflowUI) -> None:
    """The shard target, the read-back check switched off and a crop larger than the resize: the run's conf holds
    what the user chose (a select and a boolean changed in the form), and validate refuses it before any Spark."""
    form = ui.open_trigger_form()
    form.open_section("Source")
    form.switch_on("Use the generated sample")
    form.open_section("Target")
    form.choose("Target", "shards")
    form.open_section("Checks")
    form.switch_on("Read-back check", on=False)
    form.open_section("Transform")
    form.fill("Center-crop size", "300")
    run_id = form.submit()
    conf = ui.api(f"dags/{DAG_ID}/dagRuns/{quote(run_id)}")["conf"]
    assert (conf["target"], conf["read_check"], conf["crop"], conf["sample"]) == ("shards", False, 300, True), conf
    assert ui.wait_for_run(run_id) == "failed"
    states = ui.task_states(run_id)
    assert states["validate"] == "failed"
    for task in SPARK_TASKS:
        assert states[task] == "upstream_failed", (task, states)  # never started: no Spark work
    ui.shot("run-crop-too-large")
    lines = ui.task_log_lines(run_id, "validate")
    assert lines, "the validate task's log shows no line"
    level, message = lines[0]
    assert level == "ERROR"
    assert message.startswith("invalid ingest settings: crop 300 must be between 1 and resize 256"), message
    ui.shot("validate-log-crop-too-large")


def test_invalid_keyspace_is_refused_by_the_form(ui: AirflowUI) -> None:
    before = ui.run_ids()
    form = ui.open_trigger_form()
    form.open_section("Source")
    form.switch_on("Use the generated sample")
    form.open_section("Cassandra")
    form.fill("Keyspace", "1bad-ks")
    error = form.refused()
    assert "keyspace" in error
    assert "'1bad-ks' does not match" in error
    ui.shot("form-invalid-keyspace")
    assert ui.run_ids() == before  # no run was created, so no task (and no Spark job) ran
