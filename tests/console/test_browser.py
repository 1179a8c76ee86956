"""The console end to end: a real headless Chromium against real `taskward serve` and
`taskward sweeper` processes running the deterministic test engine (tests/engines.py),
on each store (docs/operations.md, Operator console).

The browser logs in with an admin token, finds a new task in the list, opens it and
watches its output grow through its own `EventSource` while the task still runs (each
row added live showing when its event was stored), cancels a running task and retries a
dead letter. Screenshots of the overview and of a running task are saved in the test's
temporary directory.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from core.settings import Settings
from core.store.clients import create_client
from core.store.connect import open_database
from tests.api.helpers import register_test_model
from tests.api.served import running_service
from tests.console.browser import chromium
from tests.databases import migrated_store
from tests.engines import expected_text

WAIT_MS = 30_000


@dataclass(frozen=True)
class Served:
    base_url: str
    token: str  # an admin client's

    def api(self) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=30,
                            headers={"Authorization": f"Bearer {self.token}"})

    def create(self, directives: str, **body: Any) -> str:
        with self.api() as api:
            answer = api.post("/v1/responses", json={"model": "words", "input": directives,
                                                     **body})
        assert answer.status_code == 202, answer.text
        return str(answer.json()["id"])

    def task(self, task_id: str) -> dict[str, Any]:
        with self.api() as api:
            return dict(api.get(f"/v1/tasks/{task_id}").json())

    def event_times(self, task_id: str) -> dict[int, str]:
        """Each stored event's `created_at`, by seq."""
        with self.api() as api:
            page = api.get(f"/v1/tasks/{task_id}/events", params={"limit": 1000}).json()
        return {event["seq"]: event["created_at"] for event in page["data"]}


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           sqlite_template: Path) -> Iterator[Served]:
    workdir = tmp_path_factory.mktemp(f"console-{request.param}")
    with ExitStack() as stack:
        url = stack.enter_context(migrated_store(request.param, workdir, sqlite_template))
        db = open_database(Settings(database_url=url))
        register_test_model(db, workdir / "models")
        admin = create_client(db, name="operator", scopes=frozenset({"admin"}))
        db.dispose()
        service = stack.enter_context(running_service(url, workdir))
        yield Served(service.base_url, admin.token)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as launched:
        yield launched


@pytest.fixture
def page(browser: Browser, served: Served) -> Iterator[Page]:
    context = browser.new_context(base_url=served.base_url)
    context.set_default_timeout(WAIT_MS)
    opened = context.new_page()
    opened.goto("/console")
    expect(opened).to_have_url(f"{served.base_url}/console/login")
    opened.fill("#token", served.token)
    opened.click("button[type=submit]")
    expect(opened).to_have_url(f"{served.base_url}/console")
    yield opened
    context.close()


def test_the_overview_shows_the_queue_and_its_chart(page: Page, tmp_path: Path) -> None:
    expect(page.locator("h1")).to_contain_text("Overview")
    expect(page.locator("#throughput")).to_be_visible()
    expect(page.locator("#count-queued")).to_be_visible()
    page.screenshot(path=str(tmp_path / "overview.png"), full_page=True)
    assert (tmp_path / "overview.png").stat().st_size > 1000


def test_a_running_tasks_output_grows_live_on_its_page(page: Page, served: Served,
                                                       tmp_path: Path) -> None:
    task_id = served.create("words=40 delay=0.1")
    page.goto("/console/tasks")
    _reload_until(page, f"a[href='/console/tasks/{task_id}']")
    page.click(f"a[href='/console/tasks/{task_id}']")
    expect(page.locator("#live")).to_have_text("following live")

    output = page.locator("#output")
    expect(output).not_to_have_text("")
    seen = output.text_content() or ""
    page.wait_for_function(
        "seen => document.getElementById('output').textContent.length > seen", arg=len(seen))
    grown = output.text_content() or ""
    assert served.task(task_id)["status"] == "running", "the text grew only after the end"
    assert grown.startswith(seen) and len(grown) > len(seen)
    page.screenshot(path=str(tmp_path / "running-task.png"), full_page=True)

    expect(page.locator("#status .status")).to_have_text("completed")
    expect(output).to_have_text(expected_text(40))
    expect(page.locator("#live")).to_have_text("finished")
    assert (tmp_path / "running-task.png").stat().st_size > 1000


def test_a_row_added_live_shows_when_its_event_was_stored(page: Page, served: Served) -> None:
    task_id = served.create("words=10 delay=0.2")
    page.goto(f"/console/tasks/{task_id}")
    drawn = page.locator("#events tr").count()  # by the server, with their stored times
    expect(page.locator("#live")).to_have_text("finished")
    page.wait_for_function(
        "() => [...document.querySelectorAll('#events tr')].every(row => row.cells[2].textContent)")
    shown = page.evaluate(
        "() => [...document.querySelectorAll('#events tr')]"
        ".map(row => [Number(row.cells[0].textContent), row.cells[2].textContent])")
    assert len(shown) > drawn, "no row was added live"
    assert dict(shown) == served.event_times(task_id)


def test_cancelling_a_running_task_from_its_page(page: Page, served: Served) -> None:
    task_id = served.create("words=400 delay=0.05")
    page.goto(f"/console/tasks/{task_id}")
    expect(page.locator("#status .status")).to_have_text("running")
    page.click("#cancel button")
    expect(page).to_have_url(f"{served.base_url}/console/tasks/{task_id}")
    expect(page.locator("#status .status")).to_have_text("cancelled")
    assert served.task(task_id)["status"] == "cancelled"


def test_retrying_a_dead_letter_from_the_console(page: Page, served: Served) -> None:
    failed = served.create("words=3 fail=retryable fail_at=0", max_attempts=1)
    page.goto("/console/dead-letters")
    row = f"tr:has(a[href='/console/tasks/{failed}'])"
    _reload_until(page, row)
    page.click(f"{row} button")
    expect(page.locator("a", has_text=failed)).to_be_visible()  # "Retry of" the old task
    retried = page.url.rsplit("/", 1)[-1]
    assert retried != failed
    assert served.task(retried)["status"] in {"queued", "loading", "running", "failed"}


def _reload_until(page: Page, selector: str, seconds: float = 30) -> None:
    """Reload the current page until `selector` is on it (lists do not refresh alone)."""
    deadline = time.monotonic() + seconds
    while page.locator(selector).count() == 0:
        assert time.monotonic() < deadline, f"{selector} did not appear within {seconds} s"
        time.sleep(0.3)
        page.reload()
