"""`GET /metrics`: the queue's figures as Prometheus reads them, from the store."""

from __future__ import annotations

from typing import Any

from litestar.testing import TestClient
from prometheus_client.parser import text_string_to_metric_families

from core.states import Status
from core.store import claims
from core.store.database import Database
from tests.store.helpers import force, new_task

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
