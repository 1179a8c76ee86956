"""The peer benchmark measures every system the same way (`bench/peers.py`).

Each system's job start is noted by its own job function (taskward: the bench's plug-in
engine) outside the queue's records; each workload runs at the system's best setting;
refused enqueues are problems, not acknowledgements; rounds rotate every system through
every position.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench import noop_engine, peers
from bench.http import load
from bench.peer_drivers.settings import batch_size, pool_size
from bench.peer_systems import ROOT, Taskward, rows
from bench.startup import Checkout, queue, spawn_sweeper, top_up
from core.store.connect import create_db_engine
from core.store.database import Database
from tests.scheduler.processes import environment, wait_until


def test_pgqueuer_runs_latency_at_batch_size_one_and_the_drain_at_eight() -> None:
    assert (batch_size(16, "latency"), batch_size(16, "drain")) == (1, 8)


def test_procrastinate_worker_pool_is_sized_from_the_slots() -> None:
    worker = argparse.Namespace(step="worker", slots=16, producers=8)
    producer = argparse.Namespace(step="enqueue", slots=16, producers=8)
    assert (pool_size(worker), pool_size(producer)) == (18, 8)


def test_default_rounds_put_each_system_once_in_each_position() -> None:
    systems: list[Any] = ["taskward", "procrastinate", "pgqueuer"]
    orders = [peers.order_of(systems, r) for r in range(peers.ROUNDS)]
    for position in range(len(systems)):
        assert sorted(str(order[position]) for order in orders) == sorted(systems)


def test_figures_over_two_rounds_are_called_a_mean() -> None:
    assert peers.over_rounds(2) == "mean of 2 rounds"
    assert peers.over_rounds(3) == "median of 3 rounds"


def test_acknowledgement_latencies_count_only_202s() -> None:
    async def scenario() -> Any:
        calls = iter(range(10**6))

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while await reader.readuntil(b"\r\n\r\n"):
                    refused = next(calls) % 2 == 1
                    if refused:  # a slow refusal: its time must not look like an ack's
                        await asyncio.sleep(0.05)
                    status = b"429 Too Many Requests" if refused else b"202 Accepted"
                    writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: 2\r\n\r\n{}")
                    await writer.drain()
            except asyncio.IncompleteReadError:  # the client closed its connection
                writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await load(port, lambda: b"GET / HTTP/1.1\r\nHost: t\r\n\r\n", 1, 0.5,
                              ok=202)

    run = asyncio.run(scenario())
    assert run.statuses[202] >= 2 and run.statuses[429] >= 2
    assert len(run.latencies) == run.statuses[202]
    assert max(run.latencies) < 0.04


class _RefusingSystem:
    """An enqueue that was answered 429 for some calls, all acknowledged ones stored."""

    name = "refusing"

    @contextmanager
    def database(self, workdir: Path) -> Iterator[str]:
        yield "unused"

    def enqueue(self, url: str, producers: int, seconds: float,
                logs: Path) -> dict[str, Any]:
        return {"count": 3, "seconds": 1.0, "latencies": [0.001] * 3,
                "statuses": {202: 3, 429: 2}}

    def stored(self, url: str) -> int:
        return 3


def test_an_enqueue_answered_other_than_202_is_a_problem(tmp_path: Path) -> None:
    figures = peers.Figures()
    peers.enqueue(_RefusingSystem(), tmp_path, 1.0, figures)  # type: ignore[arg-type]
    assert figures.problems == ["refusing: 2 enqueue call(s) not acknowledged "
                                "(statuses {429: 2})"]


def test_taskward_is_timed_and_counted_by_its_engine_entries(tmp_path: Path) -> None:
    system = Taskward("postgresql", 1)
    logs = tmp_path / "logs"
    logs.mkdir()
    with system.database(tmp_path) as url:
        system.fill(url, 12)
        owners = rows(url, "SELECT DISTINCT t.client_id, c.name FROM tasks t "
                           "JOIN clients c ON c.id = t.client_id")
        with system.workers(url, 1, 4, logs, "drain"):
            wait_until(lambda: system.finished(url) >= 12, timeout=60, what="the drain")
        timeline = system.timeline(url, logs, 1)
        task_of = {noop_engine.tag_of(json.loads(request)["input"]): task
                   for task, request in rows(url, "SELECT id, request FROM tasks")}
        entries = noop_engine.read_executions(logs / "taskward-executions-0")
        # A second run of one task inside the same claim: one loading event, two entries.
        tag, at = entries[0]
        with (logs / "taskward-executions-0").open("a") as log:
            log.write(f"{tag} {at + 0.001:.6f}\n")
        rerun = system.timeline(url, logs, 1)
    assert [name for _, name in owners] == ["bench"]  # filled through a real client
    assert timeline.starts == {task_of[tag]: at for tag, at in entries}
    assert timeline.first_starts == {0: min(at for _, at in entries)}
    assert peers.exactly_once("taskward", timeline, 12) == []
    assert peers.exactly_once("taskward", rerun, 12) == [
        "taskward: 1 job(s) executed more than once"]


def test_startup_times_the_first_job_by_the_engine_entry(tmp_path: Path) -> None:
    with queue("sqlite", tmp_path) as queued:
        db = Database(create_db_engine(queued.settings))
        try:
            top_up(db, queued, 5, "spawn")
            env = environment(queued.settings, worker_concurrency=4,
                              engine_modules=noop_engine.MODULE)
            spawn = spawn_sweeper(Checkout(ROOT), db, env, "startup-test", tmp_path)
        finally:
            db.dispose()
    entries = noop_engine.read_executions(tmp_path / "startup-test.executions")
    assert entries and all(tag.startswith("spawn-") for tag, _ in entries)
    assert 0 < spawn.first_job_ms < spawn.completion_ms + 1  # that stamp: whole ms
