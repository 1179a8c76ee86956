"""Failover between base URLs: one of two llama-servers is killed -9 mid-run; every task
completes once, its streamed text neither lost nor repeated (the attempt continued on the
other server), and /metrics shows the dead URL in cool-down."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from litestar.testing import TestClient

from core.settings import Settings
from core.store.database import Database
from infra.app import serving_app
from tests.scheduler.helpers import event_data, output_text, streamed_text
from tests.scheduler.processes import wait_until
from tests.store.helpers import task_row
from tests.upstream.helpers import MODEL, add_upstream, enqueue
from tests.upstream.llama import LlamaServer
from tests.upstream.served import sweeper, upstream_env


def test_a_killed_server_is_failed_over_and_cooled_down(
    db: Database, settings: Settings, tmp_path: Path, llamas: list[LlamaServer]
) -> None:
    doomed, survivor = (LlamaServer(tmp_path / "llama", parallel=2).start() for _ in range(2))
    llamas += [doomed, survivor]
    add_upstream(db, [doomed.base_url, survivor.base_url], max_concurrency=4)
    task_ids = enqueue(db, 6, max_output_tokens=40)
    child = sweeper(upstream_env(settings.database_url, tmp_path, upstream_cooldown_seconds=60),
                    tmp_path / "sweeper.log")
    try:
        wait_until(lambda: doomed.busy_slots() > 0 and any(
            output_text(db, t) for t in task_ids), timeout=60, what="output from both servers")
        doomed.kill9()
        wait_until(lambda: all(task_row(db, t).status == "completed" for t in task_ids),
                   timeout=180, what="every task to complete")
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=10)

    for task_id in task_ids:
        assert len(event_data(db, task_id, "response.completed")) == 1
        assert streamed_text(db, task_id) == output_text(db, task_id) != ""
        assert task_row(db, task_id).attempts == 1  # continued in the same attempt
    with TestClient(serving_app(settings)) as client:
        metrics = client.get("/metrics").text
    assert f'taskward_upstream_cooldown{{base_url="{doomed.base_url}",model="{MODEL}"}} 1.0' in (
        metrics)
    assert survivor.base_url not in metrics
    assert f'taskward_upstream_errors_total{{code="upstream_unavailable",model="{MODEL}"}}' in (
        metrics)
