"""Statements, round trips and CPU seconds per no-op task of the sweeper's hot path.

Run from the repository root: `.venv/bin/python -m bench.round_trips [--tasks N]`.

One in-process pass (`scheduler.claiming.execute_due`, 16 slots, the deterministic
test engine with `words=1`) drains N tasks committed beforehand, on SQLite and on
PostgreSQL. Every statement is counted (SQLAlchemy `before_cursor_execute`) under the
store operation that sent it (claim, start, flush, completion; the model check reads
nothing of its own: its entry comes with the claim), and so
are the transactions; on PostgreSQL psycopg sends BEGIN and COMMIT as round trips of
their own, so round trips = statements + 2 per transaction there. A statement that
commits by itself on a driver cursor (PostgreSQL's claim and completion) is counted
as a statement and no transaction: one round trip. The CPU figure is
this process's CPU time during the pass (all its threads) per task: unlike wall time
it hardly depends on what else runs on the machine. `--lone N` runs N passes of one
task each instead: a lone task's life (its claim, the claims that find nothing
after it, its completion).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from pathlib import Path
from typing import Any

from sqlalchemy import event

import tests.engines  # noqa: F401  registers the `test.words` engine its model names
from bench.throughput import MODEL, store
from core.settings import Settings
from core.store import claims, completion, pg_claims, pg_completion, worker_writes
from core.store.births import NewTask, insert_task
from core.store.connect import create_db_engine
from core.store.database import Database
from core.store.driver import autocommit_cursor
from scheduler.claiming import execute_due

_SET_UP = "set-up"  # the tasks' enqueue, left out of the figures
_phase = threading.local()


def _tagged(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    @wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        outer = getattr(_phase, "name", None)
        _phase.name = outer or name
        try:
            return function(*args, **kwargs)
        finally:
            _phase.name = outer
    return run


@contextmanager
def _phases() -> Iterator[None]:
    """Tag every statement with the store operation of the hot path that sent it."""
    patched = [(claims, "claim"), (completion, "complete_all"),
               (worker_writes, "start_running"), (worker_writes, "append_output")]
    saved = [(module, name, getattr(module, name)) for module, name in patched]
    for module, name, function in saved:
        setattr(module, name, _tagged(name, function))
    try:
        yield
    finally:
        for module, name, function in saved:
            setattr(module, name, function)


class _Counted:
    """A driver cursor whose every `execute` is counted as a statement first."""

    def __init__(self, cursor: Any, count: Callable[..., None]) -> None:
        self.__dict__.update(_cursor=cursor, _count=count)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._cursor, name, value)

    def execute(self, *args: Any) -> Any:
        self._count()
        return self._cursor.execute(*args)


@contextmanager
def _autocommit_counted(count: Callable[..., None]) -> Iterator[None]:
    """Count the statements that commit by themselves on a driver cursor
    (`core.store.driver.autocommit_cursor`), which SQLAlchemy's events do not see: one
    round trip each, no BEGIN or COMMIT."""
    users = [pg_claims, pg_completion]

    @contextmanager
    def counted(engine: Any) -> Iterator[Any]:
        with autocommit_cursor(engine) as cursor:
            yield _Counted(cursor, count)

    for module in users:
        module.autocommit_cursor = counted  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for module in users:
            module.autocommit_cursor = autocommit_cursor  # type: ignore[attr-defined]


def measure(settings: Settings, count: int, passes: int = 1) -> dict[str, Any]:
    """Figures of `passes` passes over `count` tasks each."""
    db = Database(create_db_engine(settings))
    statements: Counter[str] = Counter()
    transactions: Counter[str] = Counter()

    def counted(*_args: Any) -> None:
        statements[getattr(_phase, "name", None) or "other"] += 1

    def began(*_args: Any) -> None:
        transactions[getattr(_phase, "name", None) or "other"] += 1

    event.listen(db.engine, "before_cursor_execute", counted)
    event.listen(db.engine, "begin", began)
    cpu = wall = 0.0
    completed = 0
    try:
        for _ in range(passes):
            _tagged(_SET_UP, _enqueue)(db, count)
            with _phases(), _autocommit_counted(counted):
                cpu, wall = cpu - time.process_time(), wall - time.perf_counter()
                completed += execute_due(db, settings, stop=threading.Event())["completed"]
                cpu, wall = cpu + time.process_time(), wall + time.perf_counter()
    finally:
        event.remove(db.engine, "before_cursor_execute", counted)
        event.remove(db.engine, "begin", began)
        db.dispose()
    if completed != count * passes:
        raise RuntimeError(f"the passes completed {completed} of {count * passes}")
    return {"statements": dict(statements), "transactions": dict(transactions),
            "cpu_ms_per_task": 1000 * cpu / completed, "tasks_per_s": completed / wall}


def _enqueue(db: Database, count: int) -> None:
    request = json.dumps({"model": MODEL, "input": "words=1"})
    with db.write() as conn:
        now = db.clock.now_ms()
        for _ in range(count):
            insert_task(db, conn, NewTask(client_id="bench", model=MODEL,
                                          request_json=request), now)


def report(kind: str, figures: dict[str, Any], count: int) -> str:
    per_round_trip = 0 if kind == "sqlite" else 2  # psycopg: BEGIN and COMMIT
    lines = [f"{kind}: {figures['cpu_ms_per_task']:.2f} CPU-ms per task, "
             f"{figures['tasks_per_s']:.0f} tasks/s (wall, noisy)"]
    phases = sorted((set(figures["statements"]) | set(figures["transactions"])) - {_SET_UP})
    total_s = total_rt = 0
    for phase in phases:
        s = figures["statements"].get(phase, 0)
        t = figures["transactions"].get(phase, 0)
        rt = s + per_round_trip * t
        total_s, total_rt = total_s + s, total_rt + rt
        lines.append(f"  {phase:20} {s / count:6.2f} statements/task  {t / count:5.2f} "
                     f"transactions/task  {rt / count:6.2f} round trips/task "
                     f"({s} statements, {t} transactions)")
    lines.append(f"  {'all':20} {total_s / count:6.2f} statements/task  "
                 f"{total_rt / count:6.2f} round trips/task")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--stores", default="sqlite,postgresql")
    parser.add_argument("--lone", type=int, default=0, help="passes of one task each")
    args = parser.parse_args()
    count, passes = (1, args.lone) if args.lone else (args.tasks, 1)
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.stores.split(","):
            with store(kind, Path(tmp), worker_concurrency=16,
                       engine_modules="tests.engines") as settings:
                figures = measure(settings, count, passes)
                print(report(kind, figures, count * passes), flush=True)


if __name__ == "__main__":
    main()
