"""Fixtures for the browser tests: Airflow as it is deployed (`imgest services up airflow-celery`: PostgreSQL, the
scheduler, two Celery workers of their own hosts) and Debian's Chromium via Playwright.

Screenshots are kept in ``$IMGEST_HOME/artifacts/browser/`` (``.imgest/artifacts/browser/`` in a checkout).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, sync_playwright

from imgest.core.paths import state_dir
from imgest.services import AirflowServer
from imgest.services.airflow_celery import CeleryAirflow
from tests.browser.airflow_ui import CHROMIUM, CHROMIUM_ARGS, AirflowUI


def _chromium_or_skip() -> str:
    if os.access(CHROMIUM, os.X_OK):
        return CHROMIUM
    found = shutil.which("chromium")
    if found:
        return found
    message = "Chromium not found: apt-get install chromium (scripts/install.sh --dev does it as root)"
    if os.environ.get("CI"):
        pytest.fail(message)  # CI installs it; a missing browser there is a broken setup, not a skip
    pytest.skip(message)


@pytest.fixture(scope="package")
def airflow_ui(airflow_celery: CeleryAirflow) -> AirflowServer:
    """The Celery deployment with connections to the embedded services (shared with its fault tests)."""
    return airflow_celery


@pytest.fixture(scope="package")
def admin_login(airflow_ui: AirflowServer) -> tuple[str, str]:
    """The admin user and the password the API server's simple auth manager generated."""
    users = json.loads((airflow_ui.home / "simple_auth_manager_passwords.json.generated").read_text())
    return next(iter(users.items()))


@pytest.fixture(scope="session")
def artifacts() -> Path:
    """Where the screenshots are kept (the folder is emptied once per test session)."""
    path = state_dir() / "artifacts" / "browser"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


@pytest.fixture(scope="package")
def browser() -> Iterator[Browser]:
    """Headless Chromium from the distribution (never a downloaded build)."""
    executable = _chromium_or_skip()
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="package")
def session_context(
    browser: Browser, airflow_ui: AirflowServer, admin_login: tuple[str, str], artifacts: Path
) -> Iterator[tuple[BrowserContext, str]]:
    """One browser context for the package, logged in as admin once (its cookie and API token): each test opens
    pages of its own in it, and the UI's scripts, cached by the context, are not fetched and compiled again."""
    # Reduced motion: the UI's transitions and spinners are not animated frame by frame in software rendering.
    context = browser.new_context(viewport={"width": 1400, "height": 1600}, reduced_motion="reduce")
    context.set_default_timeout(30_000)
    page = context.new_page()
    ui = AirflowUI(page, airflow_ui.url, artifacts)
    ui.login(*admin_login)
    ui.wait_for_dag()
    page.close()
    yield context, ui.token
    context.close()


@pytest.fixture
def ui(
    session_context: tuple[BrowserContext, str],
    airflow_ui: AirflowServer,
    artifacts: Path,
    request: pytest.FixtureRequest,
) -> Iterator[AirflowUI]:
    """A fresh page of the logged-in context; on a failure the page is kept as <test>-failure.png."""
    context, token = session_context
    page = context.new_page()
    ui = AirflowUI(page, airflow_ui.url, artifacts, token)
    yield ui
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        ui.shot(f"{request.node.name}-failure")
    page.close()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """Keep each phase's report on the test item, so the `ui` fixture knows whether the test failed."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report
