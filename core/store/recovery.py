"""What happens to a task whose worker is gone: cold-start recovery and lease expiry.

Both apply one policy table (docs/state-machine.md), set-based: one conditional UPDATE per
target state, its events inserted in bulk in the same transaction, so 100,000 leftover
tasks recover in seconds and a second run finds nothing left to change.

A cold start cannot tell a crashed worker's tasks from a live one's by their leases
(after a kill -9 they are unexpired too: that is the case it is for), so on SQLite every
process that runs attempts holds a sign of life for as long as it lives (`sweeping`),
and recovery refuses while one does (`SweepersAlive`). PostgreSQL scopes recovery by
node instead (`Database.recovery_scope`).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import and_, or_

from core.clock import iso
from core.states import OnRestart, Status
from core.store.database import Database
from core.store.transitions import Event, PerRow, move
from core.tables import IS_ACTIVE, IS_LEASED, tasks

# (state at start, policy) -> new state. `running` under `resume` stays `running` with
# its lease cleared, so the next claim continues it from its snapshot.
RESTART_POLICY: dict[tuple[Status, OnRestart], Status] = {
    (Status.QUEUED, OnRestart.FAIL): Status.FAILED,
    (Status.QUEUED, OnRestart.RETRY): Status.QUEUED,
    (Status.QUEUED, OnRestart.RESUME): Status.QUEUED,
    (Status.LOADING, OnRestart.FAIL): Status.FAILED,
    (Status.LOADING, OnRestart.RETRY): Status.QUEUED,
    (Status.LOADING, OnRestart.RESUME): Status.QUEUED,
    (Status.RUNNING, OnRestart.FAIL): Status.FAILED,
    (Status.RUNNING, OnRestart.RETRY): Status.QUEUED,
    (Status.RUNNING, OnRestart.RESUME): Status.RUNNING,
    (Status.CANCELLING, OnRestart.FAIL): Status.CANCELLED,
    (Status.CANCELLING, OnRestart.RETRY): Status.CANCELLED,
    (Status.CANCELLING, OnRestart.RESUME): Status.CANCELLED,
}

SERVER_RESTARTED = "server_restarted"
WORKER_LOST = "worker_lost"
SWEEPERS_LOCK = "sweepers"  # `<db>.sweepers`, beside a SQLite store


class SweepersAlive(Exception):
    """Recovery refused: a process that runs attempts is alive on this SQLite store, and
    recovery would treat its running tasks as left by a crash."""

    def __init__(self) -> None:
        super().__init__("a sweeper is running on this store: stop it first; recovery "
                         "would restart its running tasks")


@contextmanager
def sweeping(db: Database) -> Iterator[None]:
    """The sign of life of a process that runs attempts (`taskward sweeper`, `sweep`,
    `run`), held for as long as it may: on SQLite a shared `flock` on `<db>.sweepers`.
    The kernel drops it however the process ends, kill -9 included, so a crash leaves
    no sign behind. Waits while a recovery runs, so no claim overlaps one. PostgreSQL:
    nothing."""
    with _sweepers_lock(db, fcntl.LOCK_SH):
        yield


@contextmanager
def _sweepers_lock(db: Database, operation: int) -> Iterator[None]:
    """`flock(operation)` on `<db>.sweepers` (0600) for the block; `SweepersAlive` when
    a non-blocking one finds it held. A descriptor of its own each time: `flock`s of
    two descriptors conflict even within one process."""
    path = db.beside(SWEEPERS_LOCK)
    if path is None:
        yield
        return
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(descriptor, operation)
        except BlockingIOError:
            raise SweepersAlive() from None
        yield
    finally:
        os.close(descriptor)


def recover(db: Database, *, node_id: str | None) -> dict[str, int]:
    """Cold start: apply the restart policy to every leftover task in scope.

    `node_id=None` means every task (SQLite, or `--all` on PostgreSQL); otherwise only
    tasks last held by that node. Returns how many tasks went to each state. On SQLite,
    raises `SweepersAlive` and changes nothing while a process is `sweeping`.
    """
    scope = [IS_ACTIVE] if node_id is None else [IS_ACTIVE, tasks.c.node_id == node_id]
    with _sweepers_lock(db, fcntl.LOCK_EX | fcntl.LOCK_NB), db.write() as conn:
        return _apply(conn, db.clock.now_ms(), scope, [Status.QUEUED, Status.LOADING,
                                                       Status.RUNNING, Status.CANCELLING],
                      reason=SERVER_RESTARTED, fail_code=SERVER_RESTARTED,
                      fail_message="the service restarted while the task was unfinished")


def expire_leases(db: Database) -> dict[str, int]:
    """Tasks whose lease ran out: the same policy, with `worker_lost` / `lease_expired`."""
    with db.write() as conn:
        now = db.clock.now_ms()
        scope = [IS_LEASED, tasks.c.lease_expires_at <= now]
        return _apply(conn, now, scope, [Status.LOADING, Status.RUNNING, Status.CANCELLING],
                      reason="lease_expired", fail_code=WORKER_LOST,
                      fail_message="the worker stopped renewing its lease")


def _apply(
    conn: Any,
    now: int,
    scope: Sequence[Any],
    states: Sequence[Status],
    *,
    reason: str,
    fail_code: str,
    fail_message: str,
) -> dict[str, int]:
    counts = {"failed": 0, "queued": 0, "running": 0, "cancelled": 0}
    released = {"owner_token": None, "lease_expires_at": None}
    error = {"code": fail_code, "message": fail_message}

    requeued = PerRow(1, lambda row: [Event("response.queued", {
        "reason": reason, "attempt": row.attempts, "run_at": iso(now)})])

    plans: list[tuple[Status, Any, dict[str, Any]]] = [
        (Status.FAILED,
         [Event("response.failed", {"error": error, "dead_lettered": False})],
         {**released, "finished_at": now, "error_code": fail_code,
          "error_message": fail_message}),
        (Status.QUEUED, requeued, {**released, "run_at": now}),
        (Status.CANCELLED, [Event("response.cancelled")], {**released, "finished_at": now}),
        (Status.RUNNING, [], released),
    ]
    for target, events, values in plans:
        # A task already in its target state is left alone, except a resumable
        # `running` one, whose lease is cleared so the next claim takes it over.
        cells = [(state, policy) for (state, policy), to in RESTART_POLICY.items()
                 if to is target and state in states
                 and (state is not target or target is Status.RUNNING)]
        if not cells:
            continue
        match = or_(*(and_(tasks.c.status == state.value, tasks.c.on_restart == policy.value)
                      for state, policy in cells))
        extra = [tasks.c.owner_token.is_not(None)] if target is Status.RUNNING else []
        rows = move(conn, now=now, expected={state for state, _ in cells},
                    where=[*scope, match, *extra], to=target, events=events, values=values)
        counts[target.value] += len(rows)
    return counts


def finalise_orphaned_cancels(db: Database) -> int:
    """`cancelling` tasks no worker holds any more -> `cancelled`.

    Lease expiry covers a worker that died holding the task; this covers a task that
    was cancelled while nobody held it (a released or recovered `resume` task waiting
    to be claimed again), which no lease will ever expire and no claim will take.
    """
    with db.write() as conn:
        now = db.clock.now_ms()
        # No owner means no lease either (every write that clears one clears both),
        # so the test runs on the lease index.
        orphaned = tasks.c.lease_expires_at.is_(None) | (tasks.c.lease_expires_at <= now)
        return len(move(conn, now=now, expected={Status.CANCELLING},
                        where=[IS_LEASED, orphaned],
                        to=Status.CANCELLED, events=[Event("response.cancelled")],
                        values={"owner_token": None, "lease_expires_at": None,
                                "finished_at": now}))
