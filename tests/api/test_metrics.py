"""`GET /metrics`: the queue's figures as Prometheus reads them, from the store."""

from __future__ import annotations

from typing import Any

from litestar.testing import TestClient
from prometheus_client.parser import text_string_to_metric_families

from core.states import OnRestart, Status
from core.store import claims, tasks, worker_writes
from core.store.database import Database
from tests.store.helpers import force, new_task, task_row

HOUR_MS = 3_600_000


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(http: TestClient[Any]) -> Samples:
    """Every sample of `/metrics` by (name, labels), parsed as Prometheus would."""
    response = http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(response.text)
            for sample in family.samples}


def test_an_empty_store_reports_zeros_for_every_figure(http: TestClient[Any]) -> None:
    samples = scrape(http)
    zeros: Samples = {
        **{("taskward_tasks", (("status", status.value),)): 0.0
           for status in (Status.QUEUED, Status.LOADING, Status.RUNNING, Status.CANCELLING)},
        ("taskward_tasks_due", ()): 0.0,
        ("taskward_oldest_due_task_age_seconds", ()): 0.0,
        ("taskward_expired_leases", ()): 0.0,
        ("taskward_dead_letters", ()): 0.0,
    }
    assert samples == zeros


def test_the_figures_follow_the_tasks_in_the_store(
    http: TestClient[Any], db: Database, model_id: str
) -> None:
    now = db.clock.now_ms()
    new_task(db, model_id)
    [stalled] = claims.claim(db, limit=1, lease_ms=60_000, node_id="gone")
    force(db, stalled.task_id, lease_expires_at=now - 1)  # its sweeper died
    waiting = [new_task(db, model_id) for _ in range(2)]
    force(db, waiting[0], run_at=now - 90_000)  # due for 90 s: the oldest
    new_task(db, model_id, run_at=now + HOUR_MS)  # queued, not yet due
    dead = new_task(db, model_id)
    force(db, dead, status=Status.FAILED.value, dead_lettered=1, finished_at=now,
          run_at=now + HOUR_MS)

    samples = scrape(http)

    assert samples[("taskward_tasks", (("status", "queued"),))] == 3  # 2 due + 1 later
    assert samples[("taskward_tasks", (("status", "loading"),))] == 1
    assert samples[("taskward_tasks_due", ())] == 2
    assert 90 <= samples[("taskward_oldest_due_task_age_seconds", ())] < 150
    assert samples[("taskward_expired_leases", ())] == 1
    assert samples[("taskward_dead_letters", ())] == 1


def test_metrics_need_no_token_and_name_no_task_or_client(
    http: TestClient[Any], db: Database, model_id: str
) -> None:
    task_id = new_task(db, model_id, client="client-secret-name")
    response = http.get("/metrics")
    assert response.status_code == 200
    assert task_id not in response.text and "client-secret-name" not in response.text


def handed_back(db: Database, model_id: str, *, delay_ms: int = 0) -> str:
    """A `resume` task that ran, then was handed back (a graceful stop, or an upstream
    cool-down when `delay_ms`): `running`, no lease, waiting for a claim."""
    task_id = new_task(db, model_id, on_restart=OnRestart.RESUME)
    [claimed] = claims.claim(db, limit=1, lease_ms=60_000, node_id="stopping")
    worker_writes.start_running(db, claimed.task_id, claimed.owner_token)
    worker_writes.release(db, claimed.task_id, claimed.owner_token, delay_ms=delay_ms)
    row = task_row(db, task_id)
    assert (row.status, row.lease_expires_at, row.owner_token) == ("running", None, None)
    return task_id


def test_a_handed_back_resume_task_is_due_and_waits_from_its_hand_back(
    http: TestClient[Any], db: Database, model_id: str
) -> None:
    now = db.clock.now_ms()
    task_id = handed_back(db, model_id)
    # Enqueued an hour ago, handed back 90 s ago: it has waited for a claim for 90 s.
    force(db, task_id, run_at=now - HOUR_MS, updated_at=now - 90_000)

    samples = scrape(http)

    assert samples[("taskward_tasks", (("status", "running"),))] == 1
    assert samples[("taskward_tasks_due", ())] == 1
    assert 90 <= samples[("taskward_oldest_due_task_age_seconds", ())] < 150
    assert samples[("taskward_expired_leases", ())] == 0


def test_a_task_handed_back_for_a_cool_down_waits_from_its_run_at(
    http: TestClient[Any], db: Database, model_id: str
) -> None:
    task_id = handed_back(db, model_id, delay_ms=HOUR_MS)
    assert scrape(http)[("taskward_tasks_due", ())] == 0  # its cool-down is not over

    now = db.clock.now_ms()
    force(db, task_id, updated_at=now - 90_000, run_at=now - 30_000)  # over 30 s ago
    samples = scrape(http)

    assert samples[("taskward_tasks_due", ())] == 1
    assert 30 <= samples[("taskward_oldest_due_task_age_seconds", ())] < 90


def test_the_oldest_due_age_is_the_longest_wait_of_queued_and_handed_back_tasks(
    http: TestClient[Any], db: Database, model_id: str
) -> None:
    now = db.clock.now_ms()
    resumable = handed_back(db, model_id)
    force(db, resumable, run_at=now - HOUR_MS, updated_at=now - 200_000)
    queued = new_task(db, model_id)
    force(db, queued, run_at=now - 90_000)

    samples = scrape(http)

    assert samples[("taskward_tasks_due", ())] == 2
    assert 200 <= samples[("taskward_oldest_due_task_age_seconds", ())] < 260


def test_a_hand_back_stamped_by_a_clock_ahead_of_this_one_waits_0_not_less(
    http: TestClient[Any], db: Database, model_id: str
) -> None:
    now = db.clock.now_ms()
    task_id = handed_back(db, model_id)
    force(db, task_id, run_at=now - HOUR_MS, updated_at=now + 60_000)  # a sweeper's clock

    samples = scrape(http)

    assert samples[("taskward_tasks_due", ())] == 1
    assert samples[("taskward_oldest_due_task_age_seconds", ())] == 0


def test_a_cancel_nobody_holds_counts_as_a_lease_a_pass_must_take_back(
    http: TestClient[Any], db: Database, model_id: str
) -> None:
    task_id = handed_back(db, model_id)
    assert tasks.cancel(db, task_id, None).status_code == 202  # nobody holds it to stop

    samples = scrape(http)

    assert samples[("taskward_tasks", (("status", "cancelling"),))] == 1
    assert samples[("taskward_expired_leases", ())] == 1
    assert samples[("taskward_tasks_due", ())] == 0  # a pass finalises it; no claim takes it


def test_a_held_cancel_within_its_lease_is_not_counted(
    http: TestClient[Any], db: Database, model_id: str
) -> None:
    new_task(db, model_id)
    [claimed] = claims.claim(db, limit=1, lease_ms=60_000, node_id="alive")
    tasks.cancel(db, claimed.task_id, None)

    assert scrape(http)[("taskward_expired_leases", ())] == 0


def test_head_answers_like_get_without_a_body(http: TestClient[Any]) -> None:
    response = http.head("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert response.content == b""
