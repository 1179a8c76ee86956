"""Fair claiming against the FIFO claim it replaced, with 100,000 tasks queued, in one run.

Run from the repository root: `.venv/bin/python -m bench.fairness [--drain N]`.

For each store, three queues of `--queued` tasks (default 100,000), each filled into its
own empty database and ANALYZEd:
- fair, 100 clients: the claim of `core.store.claims` over tasks of 100 clients;
- fair, 1 client: the same claim, one client's backlog;
- FIFO, 100 clients: the claim as it was before priorities (`ORDER BY run_at, id` over
  `ix_tasks_due`, no placing of waiting tasks), swapped in for this run only.
Then `--drain` tasks are drained as one sweeper's slots would: claim 16, complete the
16 in one transaction (`complete_all`, as the group commit does), repeat, in
`--rounds` rounds that alternate between the three. Figures:
claim latency p50/p99 (the claim transaction alone) and drain tasks/s (claims plus
completions). The queue stays above 95 % of its size throughout, so every claim runs
against ~100,000 queued tasks.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from pathlib import Path
from typing import Any
from unittest import mock

from sqlalchemy import bindparam

import tests.engines  # noqa: F401  registers the `test.words` engine its model names
from core.engines.base import Usage
from core.models_registry import register
from core.settings import Settings
from core.store import claims
from core.store.completion import Completion, complete_all
from core.store.connect import create_db_engine
from core.store.database import Database
from core.store.line import place_due
from core.tables import IS_QUEUED, tasks
from infra.migrate import upgrade
from tests.databases import private_pg_database
from tests.store.helpers import fill_line

MODEL = "words"
SLOTS = 16


@contextmanager
def database(kind: str, workdir: Path) -> Iterator[Database]:
    """An empty migrated store of `kind` with the model registered."""
    models_dir = workdir / "models"
    models_dir.mkdir(exist_ok=True)
    (models_dir / "words.bin").write_bytes(b"no-op model\n")
    with _url(kind, workdir) as url:
        engine = create_db_engine(Settings(database_url=url))
        upgrade(engine)
        db = Database(engine)
        register(db, models_dir, "words.bin", model_id=MODEL, engine="test.words")
        try:
            yield db
        finally:
            db.dispose()


@contextmanager
def _url(kind: str, workdir: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{workdir / f'fair-{time.time_ns()}.db'}"
        return
    with private_pg_database() as url:
        yield url


_FIFO = {pool: claims._candidates_query(IS_QUEUED, tasks.c.run_at <= bindparam("p_now"),
                                        models_term, order=(tasks.c.run_at, tasks.c.id),
                                        with_output=False)
         for pool, models_term in claims._POOLS.items()}


@contextmanager
def fifo_claim() -> Iterator[None]:
    """The claim before priorities and fairness: oldest `run_at` first, nothing placed."""
    with mock.patch.object(claims, "_QUEUED", _FIFO), \
            mock.patch.object(claims, "place_due", lambda conn, now: 0):
        yield


def drain(db: Database, count: int, latencies: list[float]) -> tuple[int, float]:
    """Drain `count` tasks; (tasks drained, seconds), each claim's latency appended."""
    done = 0
    started = time.perf_counter()
    while done < count:
        before = time.perf_counter()
        taken = claims.claim(db, limit=SLOTS, lease_ms=60_000, node_id="bench")
        latencies.append((time.perf_counter() - before) * 1000)
        if not taken:
            raise RuntimeError("the queue ran dry")
        failures = complete_all(db, [Completion(c.task_id, c.owner_token, [], Usage(),
                                                start=True) for c in taken])
        assert not any(failures)
        done += len(taken)
    return done, time.perf_counter() - started


SCENARIOS: list[tuple[str, int, Callable[[], AbstractContextManager[Any]]]] = [
    ("fair, 100 clients", 100, nullcontext),
    ("fair, 1 client", 1, nullcontext),
    ("FIFO, 100 clients", 100, fifo_claim),
]


def bench_store(kind: str, workdir: Path, queued: int, total: int, rounds: int) -> None:
    """Every scenario in its own database, drained in alternating rounds, so a noisy
    neighbour slows them alike."""
    with ExitStack() as stack:
        dbs = [stack.enter_context(database(kind, workdir)) for _ in SCENARIOS]
        for db, (_, clients, _) in zip(dbs, SCENARIOS):
            fill_line(db, MODEL, clients=clients, per_client=queued // clients)
        latencies: list[list[float]] = [[] for _ in SCENARIOS]
        spent: list[list[float]] = [[0, 0.0] for _ in SCENARIOS]
        for turn in range(rounds):
            for index in _rotated(range(len(SCENARIOS)), turn):  # no one always goes first
                db, (_, _, claim_kind) = dbs[index], SCENARIOS[index]
                with claim_kind():
                    drained, seconds = drain(db, total // rounds, latencies[index])
                spent[index][0] += drained
                spent[index][1] += seconds
        for (name, _, _), seen, (done, seconds) in zip(SCENARIOS, latencies, spent):
            cuts = statistics.quantiles(seen, n=100)
            print(f"| {kind} | {name} | {cuts[49]:.2f} | {cuts[98]:.2f} | "
                  f"{done / seconds:,.0f} |", flush=True)
        print(f"| {kind} | (placing step alone, nothing waiting) | "
              f"{placing_ms(dbs[0]):.3f} | | |", flush=True)


def placing_ms(db: Database, calls: int = 500) -> float:
    """What the fair claim adds to every claim when no waiting task is due: the probe of
    `ix_tasks_outside_line`, in ms per call (median of the per-call times)."""
    times = []
    with db.write() as conn:
        now = db.clock.now_ms()
        for _ in range(calls):
            before = time.perf_counter()
            place_due(conn, now)
            times.append((time.perf_counter() - before) * 1000)
    return statistics.median(times)


def _rotated(items: range, by: int) -> list[int]:
    shift = by % len(items)
    return [*items[shift:], *items[:shift]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queued", type=int, default=100_000)
    parser.add_argument("--drain", type=int, default=3_000, help="tasks per scenario")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--stores", default="sqlite,postgresql")
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()}")
    print("| store | queue | claim p50 ms | claim p99 ms | drain tasks/s |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.stores.split(","):
            bench_store(kind, Path(tmp), args.queued, args.drain, args.rounds)
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
