"""A page object for the Airflow 3 UI as a person uses it: log in, fill the trigger form, follow a run.

Every check reads what the UI shows (the form, the run's task table, the task log, the Assets view); the REST API,
with a token for the same user, is used only to wait for a run to end and to count runs.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote

from playwright.sync_api import Locator, Page, expect

CHROMIUM = "/usr/bin/chromium"
# The machine's closed network refuses Chromium's background connections: switch them off.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DAG_ID = "ingest_imagenet"
FINISHED = ("success", "failed")
LOG_LINE = re.compile(r"\[\d{4}-\d\d-\d\d[^\]]*\]\s+(DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+-\s+(.*)")


def _label(title: str) -> re.Pattern[str]:
    """A field's accessible name: its title, then the required marker when there is one."""
    return re.compile(rf"^\s*{re.escape(title)}\s*\*?\s*$")


def state_key(text: str) -> str:
    """'Upstream Failed' -> 'upstream_failed', as the API spells states."""
    return text.strip().lower().replace(" ", "_")


@dataclass
class TriggerForm:
    """The 'Trigger Dag' dialog: Param sections as an accordion, one open at a time."""

    page: Page
    dialog: Locator

    def sections(self) -> list[str]:
        """Section titles, top to bottom, as the accordion shows them."""
        return [t.strip() for t in self.dialog.locator("button[data-part=item-trigger]").all_inner_texts()]

    def open_section(self, title: str) -> Locator:
        """Expand section TITLE (closing the one open) and return its content."""
        trigger = self.dialog.locator("button[data-part=item-trigger]").filter(has_text=re.compile(rf"^{title}$"))
        if trigger.get_attribute("aria-expanded") != "true":
            trigger.click()
        content = self.dialog.get_by_role("region", name=title)
        content.wait_for(state="visible")
        expect(self.dialog.get_by_role("region")).to_have_count(1)  # the section that was open has closed
        return content

    def field(self, title: str) -> Locator:
        """The input of the field titled TITLE (its row: the label, the input, the description)."""
        label = self.page.locator("label").filter(has_text=_label(title))
        return self.dialog.get_by_role("group").filter(has=label).locator("input").first

    def switch_on(self, title: str, on: bool = True) -> None:
        """Turn a boolean Param's switch on (or off with ON false), clicking its label as a person would."""
        box = self.field(title)
        if box.is_checked() != on:
            box.locator("xpath=..").click()
        if box.is_checked() != on:
            raise AssertionError(f"the switch {title!r} did not turn {'on' if on else 'off'}")

    def choose(self, title: str, option: str) -> None:
        """Pick the enum option whose label starts with OPTION from the dropdown TITLE."""
        self.field(title).click()
        self.page.get_by_role("option", name=re.compile(rf"^{re.escape(option)}\b")).click()

    def fill(self, title: str, value: str) -> None:
        """Type VALUE into the text or number field TITLE."""
        box = self.field(title)
        box.fill(value)
        box.blur()

    def submit_button(self) -> Locator:
        return self.dialog.get_by_role("button", name="Trigger", exact=True)

    def submit(self) -> str:
        """Press Trigger; the UI opens the new run's page; returns its run id."""
        self.submit_button().click()
        self.page.wait_for_url(re.compile(rf"/dags/{DAG_ID}/runs/[^/]+$"))
        return unquote(self.page.url.rsplit("/runs/", 1)[1])

    def refused(self) -> str:
        """Press Trigger expecting a refusal; returns the error the dialog shows."""
        self.submit_button().click()
        alert = self.dialog.get_by_text(re.compile("Invalid input for param"))
        alert.wait_for(state="visible")
        return alert.inner_text()


@dataclass
class AirflowUI:
    """One logged-in browser page on the Airflow UI at BASE_URL; screenshots go to ARTIFACTS."""

    page: Page
    base_url: str
    artifacts: Path
    token: str = ""

    def login(self, user: str, password: str) -> None:
        """Sign in through the login page (and get an API token for the same user)."""
        self.page.goto(self.base_url + "/")
        self.page.get_by_label("Username").fill(user)
        self.page.get_by_label("Password").fill(password)
        self.page.get_by_role("button", name="Sign in").click()
        self.page.get_by_role("link", name="Dags").first.wait_for()
        resp = self.page.request.post(self.base_url + "/auth/token", data={"username": user, "password": password})
        if not resp.ok:
            raise AssertionError(f"POST /auth/token for {user}: {resp.status} {resp.text()[:200]}")
        self.token = resp.json()["access_token"]

    def shot(self, name: str, target: Locator | None = None) -> Path:
        """Keep a screenshot as a test artifact (the element TARGET, or the whole page)."""
        path = self.artifacts / f"{name}.png"
        if target is None:
            self.page.screenshot(path=path, full_page=True, animations="disabled")
        else:
            target.screenshot(path=path, animations="disabled")
        return path

    def api(self, path: str) -> dict:
        """GET /api/v2/PATH as the logged-in user."""
        resp = self.page.request.get(
            f"{self.base_url}/api/v2/{path}", headers={"Authorization": f"Bearer {self.token}"}
        )
        if not resp.ok:
            raise AssertionError(f"GET /api/v2/{path}: {resp.status} {resp.text()[:200]}")
        return resp.json()

    def wait_for_dag(self, limit_s: float = 300.0) -> None:
        """Wait until the DAG processor has parsed the DAG (on a fresh AIRFLOW_HOME it is not there at first)."""
        deadline = time.monotonic() + limit_s
        headers = {"Authorization": f"Bearer {self.token}"}
        while not self.page.request.get(f"{self.base_url}/api/v2/dags/{DAG_ID}", headers=headers).ok:
            if time.monotonic() > deadline:
                raise AssertionError(f"{DAG_ID} not parsed by airflow after {limit_s:.0f}s")
            time.sleep(2)

    def run_ids(self) -> set[str]:
        """Every run of the DAG the API knows."""
        runs = self.api(f"dags/{DAG_ID}/dagRuns?limit=1000")["dag_runs"]
        return {r["dag_run_id"] for r in runs}

    def open_dag(self) -> None:
        self.page.goto(f"{self.base_url}/dags/{DAG_ID}")
        self.page.get_by_role("button", name="Trigger Dag").wait_for()

    def open_trigger_form(self) -> TriggerForm:
        """The DAG's page, then its Trigger button: the form with its defaults."""
        self.open_dag()
        self.page.get_by_role("button", name="Trigger Dag").click()
        dialog = self.page.get_by_role("dialog")
        dialog.locator("button[data-part=item-trigger]").first.wait_for()
        return TriggerForm(self.page, dialog)

    def wait_for_run(self, run_id: str, limit_s: float = 900.0) -> str:
        """Poll the run until it ends; returns its final state (a run still going after LIMIT_S fails the test).
        The page is left for about:blank meanwhile: the DAG page refreshes a running run every few seconds, and
        each refresh costs Chromium's renderer and the API server CPU that the run's own tasks need."""
        self.page.goto("about:blank")
        deadline = time.monotonic() + limit_s
        state = "queued"
        while time.monotonic() < deadline:
            state = self.api(f"dags/{DAG_ID}/dagRuns/{quote(run_id, safe='')}")["state"]
            if state in FINISHED:
                return state
            time.sleep(2)
        raise AssertionError(f"run {run_id} still {state} after {limit_s:.0f}s")

    def run_url(self, run_id: str) -> str:
        return f"{self.base_url}/dags/{DAG_ID}/runs/{quote(run_id, safe='')}"

    def task_states(self, run_id: str) -> dict[str, str]:
        """Each task's state as the run page's task-instance table shows it."""
        self.page.goto(self.run_url(run_id))
        heading = self.page.get_by_text(re.compile(r"^\d+ Task Instances?$"))
        total = int(heading.inner_text().split()[0])
        rows = self.page.locator("tbody tr").filter(has=self.page.get_by_test_id("table-cell-state"))
        expect(rows).to_have_count(total)  # the table fills in after its heading: wait for every row
        states: dict[str, str] = {}
        for row in rows.all():
            task = row.get_by_test_id("table-cell-task_display_name").inner_text().strip()
            states[task] = state_key(row.get_by_test_id("table-cell-state").inner_text())
        return states

    def task_log_lines(self, run_id: str, task_id: str) -> list[tuple[str, str]]:
        """(level, message) of each log line the task page shows, top to bottom."""
        self.page.goto(f"{self.run_url(run_id)}/tasks/{task_id}")
        self.page.get_by_text(LOG_LINE).first.wait_for()
        text = self.page.get_by_role("main").inner_text() if self.page.get_by_role("main").count() else ""
        text = text or self.page.inner_text("body")
        return [(m.group(1), m.group(2).strip()) for m in map(LOG_LINE.search, text.splitlines()) if m]

    def wait_for_asset(self, uri: str, limit_s: float = 180.0) -> Locator:
        """The Assets view's entry for URI. Airflow lists an Asset emitted through an AssetAlias once its scheduler
        marks it active (every ``parsing_cleanup_interval``), so the view is reloaded until it shows up."""
        deadline = time.monotonic() + limit_s
        while True:
            self.page.goto(f"{self.base_url}/assets")
            self.page.get_by_text(re.compile(r"^\d+ Assets?$")).wait_for()
            entry = self.page.get_by_text(uri, exact=True)
            if entry.count():
                return entry.first
            if time.monotonic() > deadline:
                raise AssertionError(f"{uri} not in the Assets view after {limit_s:.0f}s")
            time.sleep(3)
