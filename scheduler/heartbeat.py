"""The lease keeper: one thread per worker process renewing the leases it holds.

It runs apart from every runner and engine thread, so a slow model step or a long
flush never starves a lease (the lease is also much longer than the heartbeat period).
Its answers feed back into the attempts: `cancelling` raises the cancel flag, a renewal
that changes nothing raises `lost`. `renew_soon` makes it renew a task at its next tick
(~100 ms) instead of a heartbeat period later: how an announced cancel reaches a worker
whose engine produces nothing to write for a while (loading, a long prompt). SQLite has
no announcement between processes, so there the keeper asks the store at each tick
which of its tasks a cancel has reached: one indexed read while it holds any.
"""

from __future__ import annotations

import logging
import threading

from core.errors import LeaseLost
from core.states import Status
from core.store import worker_writes
from core.store.database import Database
from core.store.tasks import cancelling_among
from scheduler.attempt import Attempt, StopReason

log = logging.getLogger(__name__)


class LeaseKeeper:
    def __init__(
        self, db: Database, *, lease_ms: int, heartbeat_ms: int, tick_seconds: float = 0.1
    ) -> None:
        self._db = db
        self._lease_ms = lease_ms
        self._heartbeat_ms = heartbeat_ms
        self._tick = tick_seconds
        self._held: dict[str, Attempt] = {}
        self._failing: set[str] = set()  # tasks whose last renewal failed (logged once)
        self._soon: set[str] = set()  # tasks to renew at the next tick, whatever is due
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-keeper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def hold(self, attempt: Attempt) -> None:
        with self._lock:
            self._held[attempt.task_id] = attempt

    def drop(self, attempt: Attempt) -> None:
        with self._lock:
            if self._held.get(attempt.task_id) is attempt:
                del self._held[attempt.task_id]

    def renew_soon(self, task_id: str) -> None:
        """Renew `task_id` at the next tick if this process holds it (thread-safe)."""
        with self._lock:
            if task_id in self._held:
                self._soon.add(task_id)

    def renew_all_soon(self) -> None:
        """Renew every held task at the next tick (thread-safe)."""
        with self._lock:
            self._soon.update(self._held)

    def _run(self) -> None:
        while not self._stop.wait(self._tick):
            with self._lock:
                held = list(self._held.values())
                soon, self._soon = self._soon, set()
            soon |= self._cancelled_unannounced(held)
            due = self._db.clock.now_ms() - self._heartbeat_ms
            for attempt in held:
                if attempt.renewed_at_ms <= due or attempt.task_id in soon:
                    self._renew(attempt)

    def _cancelled_unannounced(self, held: list[Attempt]) -> set[str]:
        """SQLite: the held tasks now `cancelling` (a cancel from another process is
        never announced here). PostgreSQL announces every cancel: nothing to ask."""
        if not self._db.is_sqlite or not held:
            return set()
        try:
            with self._db.read() as conn:
                return cancelling_among(conn, [attempt.task_id for attempt in held])
        except Exception:  # noqa: BLE001  an unreachable store: the renewals report it
            return set()

    def _renew(self, attempt: Attempt) -> None:
        """One heartbeat; a database error is logged and retried on the next tick."""
        try:
            status = worker_writes.heartbeat(self._db, attempt.task_id, attempt.claim.owner_token,
                                             lease_ms=self._lease_ms)
        except LeaseLost:
            attempt.raise_flag(StopReason.LOST)
            return
        except Exception as exc:  # noqa: BLE001  the store is unreachable: keep trying
            if attempt.task_id not in self._failing:
                log.warning("heartbeat for task %s failed (%s); retrying every tick",
                            attempt.task_id, type(exc).__name__)
                self._failing.add(attempt.task_id)
            return
        self._failing.discard(attempt.task_id)
        attempt.renewed_at_ms = self._db.clock.now_ms()
        if status is Status.CANCELLING:
            attempt.raise_flag(StopReason.CANCEL)
