"""Every console page renders what the store holds, and its forms change the store
through the same functions as the API (docs/operations.md). Both stores."""

from __future__ import annotations

import json
import re

import pytest
from sqlalchemy import delete

from core.clients import Client, IssuedToken
from core.console_sessions import ConsoleSession
from core.schedules import create_schedule
from core.settings import Settings
from core.states import Status
from core.store.clients import create_client
from core.store.database import Database
from core.store.queue_stats import QueueStats
from core.tables import task_events
from handlers.console.chart import Chart
from handlers.console.reads import Overview
from handlers.console.render import html
from tests.api.helpers import complete_due
from tests.console.helpers import Console, dead_letter, running
from tests.store.helpers import new_task, task_row


def test_every_page_renders_for_an_admin(console: Console, db: Database, settings: Settings,
                                         model_id: str, admin: IssuedToken) -> None:
    done = new_task(db, model_id, input="words=3")
    complete_due(db, text="hello from the worker ")
    failed = dead_letter(db, model_id)
    queued = new_task(db, model_id)
    schedule = create_schedule(db, settings, admin.client_id,
                               {"cron": "*/5 * * * *", "request": {"model": model_id,
                                                                  "input": "hi"}})

    overview = console.page("/console")
    assert re.search(r'id="count-queued">1<', overview)
    assert re.search(r'id="dead">1<', overview)
    assert "1 completed" in overview and "<svg" in overview
    tasks = console.page("/console/tasks")
    assert all(task_id in tasks for task_id in (done, failed, queued))
    page = console.page(f"/console/tasks/{done}")
    assert "hello from the worker" in page and "response.completed" in page
    assert failed in console.page("/console/dead-letters")
    assert schedule.id in console.page("/console/schedules")
    assert "operator" in console.page("/console/clients")
    models = console.page("/console/models")
    assert model_id in models and re.search(r"[0-9a-f]{64}", models)


def test_the_task_list_filters_by_status_client_and_model(
    console: Console, db: Database, model_id: str,
) -> None:
    mine = new_task(db, model_id, client="cli_a")
    other = new_task(db, model_id, client="cli_b")
    complete_due(db)
    waiting = new_task(db, model_id, client="cli_b")

    by_status = console.page("/console/tasks?status=queued&client=&model=")
    assert waiting in by_status and other not in by_status
    by_client = console.page("/console/tasks?client=cli_a")
    assert mine in by_client and other not in by_client
    assert waiting not in console.page("/console/tasks?model=another")


def test_the_task_list_filters_by_priority(console: Console, db: Database,
                                           model_id: str) -> None:
    urgent = new_task(db, model_id, priority=0)
    usual = new_task(db, model_id)
    listed = console.page("/console/tasks?priority=0")
    assert urgent in listed and usual not in listed
    assert usual in console.page("/console/tasks?priority=5")


def test_the_task_list_pages_by_cursor_keeping_its_filters(console: Console, db: Database,
                                                           model_id: str) -> None:
    ids = [new_task(db, model_id) for _ in range(55)]  # the console shows 50 a page
    first = console.page("/console/tasks?status=queued")
    link = re.search(r'href="(/console/tasks\?[^"]+)">Next page', first)
    assert link, "no link to the next page"
    second = console.page(link.group(1).replace("&amp;", "&"))
    assert "status=queued" in link.group(1)
    assert all(task_id in second for task_id in ids[:5])
    assert ids[-1] in first and ids[-1] not in second


def test_a_running_task_page_starts_its_live_tail_after_what_it_shows(
    console: Console, db: Database, model_id: str,
) -> None:
    task_id = running(db, model_id)
    page = console.page(f"/console/tasks/{task_id}")
    last_seq = task_row(db, task_id).last_seq
    assert f'data-url="/v1/tasks/{task_id}/events?after={last_seq}"' in page
    assert "Cancel" in page


def test_a_long_log_shows_its_latest_events_and_all_the_text(console: Console, db: Database,
                                                              model_id: str) -> None:
    task_id = running(db, model_id, words=300)
    last_seq = task_row(db, task_id).last_seq
    page = console.page(f"/console/tasks/{task_id}")
    shown = [int(seq) for seq in re.findall(r"<tr><td>(\d+)</td>", page)]
    assert shown == list(range(last_seq - 199, last_seq + 1))
    assert "w0 w1 w2" in page and "w299 " in page
    assert f"events?after={last_seq}" in page


def test_cancel_from_the_task_page_cancels_a_queued_task(console: Console, db: Database,
                                                         model_id: str) -> None:
    task_id = new_task(db, model_id)
    answer = console.act(f"/console/tasks/{task_id}/cancel")
    assert answer.status_code == 303
    assert answer.headers["location"] == f"/console/tasks/{task_id}"
    assert task_row(db, task_id).status == Status.CANCELLED


def test_cancel_of_a_running_task_asks_its_worker_to_stop(console: Console, db: Database,
                                                          model_id: str) -> None:
    task_id = running(db, model_id)
    assert console.act(f"/console/tasks/{task_id}/cancel").status_code == 303
    assert task_row(db, task_id).status == Status.CANCELLING


def test_retrying_a_dead_letter_makes_a_new_task_and_opens_it(console: Console, db: Database,
                                                              model_id: str) -> None:
    failed = dead_letter(db, model_id)
    answer = console.act(f"/console/tasks/{failed}/retry")
    assert answer.status_code == 303
    new_id = answer.headers["location"].rsplit("/", 1)[-1]
    assert task_row(db, new_id).retry_of == failed
    assert task_row(db, new_id).status == Status.QUEUED
    assert f'href="/console/tasks/{failed}"' in console.page(answer.headers["location"])


def test_deleting_a_schedule_from_the_console(console: Console, db: Database, settings: Settings,
                                              model_id: str, admin: IssuedToken) -> None:
    schedule = create_schedule(db, settings, admin.client_id,
                               {"cron": "0 * * * *", "request": {"model": model_id, "input": "x"}})
    assert console.act(f"/console/schedules/{schedule.id}/delete").status_code == 303
    assert schedule.id not in console.page("/console/schedules")


def test_revoking_a_client_from_the_console_refuses_its_token(console: Console, db: Database
                                                              ) -> None:
    worker = create_client(db, name="batch-job", scopes=frozenset({"tasks:read"}))
    headers = {"Authorization": f"Bearer {worker.token}"}
    assert console.http.get("/v1/tasks", headers=headers).status_code == 200
    assert console.act(f"/console/clients/{worker.client_id}/revoke").status_code == 303
    assert console.http.get("/v1/tasks", headers=headers).status_code == 401
    assert "revoked" in console.page("/console/clients")


def test_an_unknown_task_is_a_404_page_not_a_problem_document(console: Console) -> None:
    answer = console.http.get("/console/tasks/resp_0000000000nothinghere")
    assert answer.status_code == 404
    assert answer.headers["content-type"].startswith("text/html")
    assert "task_not_found" in answer.text


def test_a_finished_task_offers_no_cancel_and_no_live_tail(console: Console, db: Database,
                                                           model_id: str) -> None:
    new_task(db, model_id)
    [task_id] = complete_due(db)
    page = console.page(f"/console/tasks/{task_id}")
    assert 'id="live"' not in page and "/cancel" not in page


def test_output_text_is_shown_escaped(console: Console, db: Database, model_id: str) -> None:
    new_task(db, model_id)
    [task_id] = complete_due(db, text="<script>alert(1)</script>")
    page = console.page(f"/console/tasks/{task_id}")
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_metadata_of_a_task_is_listed(console: Console, db: Database, model_id: str) -> None:
    task_id = new_task(db, model_id, metadata={"team": "search"})
    page = console.page(f"/console/tasks/{task_id}")
    assert "metadata.team" in page and "search" in page
    assert json.dumps({"team": "search"}) not in page  # shown as fields, not a blob


def test_an_upstream_model_shows_its_urls_in_place_of_a_digest() -> None:
    # The entry shape of an upstream model (upstream entries come from the upstream engine's
    # registration); rendered directly, no store involved.
    entry = {"id": "qwen", "engine": "openai", "path": None, "size_bytes": None, "sha256": None,
             "created_at": "2026-12-01T08:00:00.000Z", "metadata": {},
             "upstream": {"base_urls": ["http://gpu-1:8000/v1", "http://gpu-2:8000/v1"],
                          "model": "Qwen/Qwen2.5-7B", "api_key_env": "GPU_KEY"}}
    session = ConsoleSession(Client("cli_x", "operator", frozenset({"admin"})), "0" * 64)
    page = html("models.html", session=session, page="models", models=[entry]).content
    assert "http://gpu-1:8000/v1" in page and "http://gpu-2:8000/v1" in page
    assert "Qwen/Qwen2.5-7B" in page and "None" not in page


def test_the_pages_assets_are_served_with_one_charset_and_cached_for_a_year(
        console: Console) -> None:
    linked = set(re.findall(r'/console/static/[^"?]+', console.page("/console")))
    assert {path.rsplit(".", 1)[1] for path in linked} == {"css", "js"}
    for path in linked:
        answer = console.http.get(path)
        assert answer.status_code == 200
        kind = "text/css" if path.endswith(".css") else "text/javascript"
        assert answer.headers["content-type"] == f"{kind}; charset=utf-8"
        assert "immutable" in answer.headers["cache-control"]


def test_an_asset_of_no_such_name_is_not_found_however_long(console: Console) -> None:
    for name in ("nope.css", "a" * 65 + ".js", "x" * 2000):
        answer = console.http.get(f"/console/static/{name}")
        assert answer.status_code == 404 and "asset_not_found" in answer.text


def test_the_oldest_wait_is_never_below_zero_when_a_hand_back_was_stamped_ahead() -> None:
    """A hand-back is stamped by the clock of the process that wrote it, which may run
    ahead of the console's."""
    stats = QueueStats(by_status={}, due=1, oldest_due_at=10_500, expired_leases=0,
                       dead_letters=0)
    chart = Chart(width=0, height=0, bars=[], peak=0, completed=0, failed=0, minutes=0)
    assert Overview(now=10_000, stats=stats, chart=chart).oldest_due_wait_ms == 0
    assert Overview(now=12_000, stats=stats, chart=chart).oldest_due_wait_ms == 1_500


@pytest.mark.parametrize("removed", [50, 250])
def test_a_log_whose_newest_events_retention_removed_is_shown_as_stored(
    console: Console, db: Database, model_id: str, removed: int
) -> None:
    """Retention removes a finished task's newest events first, batch by batch: a page
    of a task left half removed read the same events again for ever (fewer than
    `EVENTS_SHOWN` removed), or showed none (more)."""
    task_id = running(db, model_id, words=600)
    last_seq = task_row(db, task_id).last_seq
    with db.write() as conn:
        conn.execute(delete(task_events).where(task_events.c.task_id == task_id,
                                               task_events.c.seq > last_seq - removed))
    stored_end = last_seq - removed

    page = console.page(f"/console/tasks/{task_id}")

    shown = [int(seq) for seq in re.findall(r"<tr><td>(\d+)</td>", page)]
    assert shown == list(range(shown[0], stored_end + 1))  # the newest stored, in order
    assert len(shown) >= 150
