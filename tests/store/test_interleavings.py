"""Random interleavings of every store operation across several fake workers.

Hypothesis drives claim, heartbeat, progress, cancel, finish, requeue, release, lease
expiry and recovery in any order under a clock that only moves when told, and checks
after every step the invariants the product promises: gapless event numbers, at most one
terminal event and it is last, a finished task never changes, one owner at a time, and a
stale owner's writes are refused. The "workers" are plain objects calling the real
store; the database is real.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from sqlalchemy import Row, delete, select

from core.engines.base import Usage
from core.errors import CancelRequested, Conflict, LeaseLost
from core.objects import TERMINAL_EVENTS
from core.settings import Settings as TaskwardSettings
from core.states import TERMINAL, OnRestart, Status
from core.store import births, claims, completion, new_tasks, tasks, worker_writes
from core.store.connect import create_db_engine
from core.store.database import Database
from core.store.recovery import expire_leases, recover
from core.store.transitions import Event
from core.tables import metadata, task_events
from core.tables import tasks as tasks_table
from tests.clocks import HandClock

LEASE_MS = 10_000
WORKERS = 3


@dataclass
class FakeWorker:
    held: dict[str, str] = field(default_factory=dict)  # task id -> owner token


def interleavings(database_url: str) -> type[RuleBasedStateMachine]:
    class Interleavings(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.clock = HandClock(1_800_000_000_000)
            self.db = Database(create_db_engine(TaskwardSettings(database_url=database_url)),
                               self.clock)
            with self.db.write() as conn:
                for table in reversed(metadata.sorted_tables):
                    if table.name not in ("models",):
                        conn.execute(delete(table))
            self.workers = [FakeWorker() for _ in range(WORKERS)]
            self.task_ids: list[str] = []
            self.finished: dict[str, tuple[str, int]] = {}

        def teardown(self) -> None:
            self.db.dispose()

        @initialize()
        def some_tasks(self) -> None:
            for policy in OnRestart:
                self.enqueue(policy)

        def enqueue(self, policy: OnRestart) -> None:
            result = new_tasks.enqueue(self.db, births.NewTask(
                client_id="c", model="words", request_json="{}", on_restart=policy,
                max_attempts=3))
            self.task_ids.append(result.task_id)

        def row(self, task_id: str) -> Row[Any]:
            with self.db.read() as conn:
                return conn.execute(select(tasks_table).where(tasks_table.c.id == task_id)).one()

        def fenced_write(self, worker: FakeWorker, task_id: str, write: object) -> None:
            """Run a worker write; check that it succeeded iff the worker owned the task."""
            token = worker.held[task_id]
            before = self.row(task_id)
            owned = before.owner_token == token
            try:
                write(task_id, token)  # type: ignore[operator]
            except LeaseLost:
                assert not owned, "the owner of a task in the expected state was refused"
                worker.held.pop(task_id)
                assert self.row(task_id).last_seq == before.last_seq
                return
            except CancelRequested:
                assert owned and self.row(task_id).status == Status.CANCELLING.value
                worker_writes.finish_cancelled(self.db, task_id, token)
                worker.held.pop(task_id)
                return
            assert owned, "a write by a worker that does not own the task succeeded"

        def held(self, data: st.DataObject, *states: str) -> tuple[FakeWorker, str] | None:
            """A (worker, task) pair the worker believes it holds, in one of `states` as
            far as the worker knows (a stale worker may be wrong, which is the point)."""
            worker = data.draw(st.sampled_from(self.workers))
            if not worker.held:
                return None
            task_id = data.draw(st.sampled_from(list(worker.held)))  # insertion order: replayable
            row = self.row(task_id)
            if row.owner_token == worker.held[task_id] and row.status not in states:
                return None
            return worker, task_id

        @rule(policy=st.sampled_from(list(OnRestart)))
        def add_task(self, policy: OnRestart) -> None:
            self.enqueue(policy)

        @rule(data=st.data(), limit=st.integers(1, 3))
        def claim(self, data: st.DataObject, limit: int) -> None:
            worker = data.draw(st.sampled_from(self.workers))
            for claimed in claims.claim(self.db, limit=limit, lease_ms=LEASE_MS, node_id="n"):
                for other in self.workers:
                    other_token = other.held.get(claimed.task_id)
                    assert other_token != claimed.owner_token
                worker.held[claimed.task_id] = claimed.owner_token

        @rule(data=st.data())
        def start(self, data: st.DataObject) -> None:
            if pick := self.held(data, "loading"):
                self.fenced_write(*pick, lambda t, o: worker_writes.start_running(self.db, t, o))

        @rule(data=st.data(), text=st.text("ab", min_size=1, max_size=3))
        def progress(self, data: st.DataObject, text: str) -> None:
            if pick := self.held(data, "running", "cancelling"):
                pos = self.row(pick[1]).last_seq
                self.fenced_write(*pick, lambda t, o: worker_writes.append_output(
                    self.db, t, o, [Event("response.output_text.delta", {"delta": text})],
                    text=text, snapshot_json=json.dumps({"pos": pos})))

        @rule(data=st.data())
        def heartbeat(self, data: st.DataObject) -> None:
            if pick := self.held(data, "loading", "running", "cancelling"):
                worker, task_id = pick
                try:
                    worker_writes.heartbeat(self.db, task_id, worker.held[task_id],
                                            lease_ms=LEASE_MS)
                except LeaseLost:
                    worker.held.pop(task_id)

        @rule(data=st.data(), how=st.sampled_from(["complete", "fail", "requeue", "release"]))
        def finish(self, data: st.DataObject, how: str) -> None:
            expected = ("running", "cancelling") if how == "complete" else (
                "loading", "running", "cancelling")
            if not (pick := self.held(data, *expected)):
                return
            operations = {
                "complete": lambda t, o: completion.complete(self.db, t, o, [], usage=Usage()),
                "fail": lambda t, o: worker_writes.fail(self.db, t, o, "bad", "m"),
                "requeue": lambda t, o: worker_writes.requeue(self.db, t, o, delay_ms=1000,
                                                              code="e", message="m"),
                "release": lambda t, o: worker_writes.release(self.db, t, o),
            }
            self.fenced_write(*pick, operations[how])
            pick[0].held.pop(pick[1], None)

        @rule(data=st.data())
        def cancel(self, data: st.DataObject) -> None:
            task_id = data.draw(st.sampled_from(self.task_ids))
            try:
                tasks.cancel(self.db, task_id, None)
            except Conflict:
                assert self.row(task_id).status in {s.value for s in TERMINAL}

        @rule(ms=st.integers(1, 2 * LEASE_MS))
        def time_passes(self, ms: int) -> None:
            self.clock.ms += ms

        @rule()
        def expire(self) -> None:
            expire_leases(self.db)

        @rule()
        def restart(self) -> None:
            recover(self.db, node_id=None)
            for worker in self.workers:
                worker.held.clear()

        @invariant()
        def logs_are_sound(self) -> None:
            with self.db.read() as conn:
                rows = {r.id: r for r in conn.execute(select(tasks_table))}
                events: dict[str, list[tuple[int, str]]] = {}
                for e in conn.execute(select(task_events).order_by(task_events.c.seq)):
                    events.setdefault(e.task_id, []).append((e.seq, e.type))
            for task_id, row in rows.items():
                log = events[task_id]
                assert [seq for seq, _ in log] == list(range(1, row.last_seq + 1))
                terminal = [i for i, (_, kind) in enumerate(log) if kind in TERMINAL_EVENTS]
                assert len(terminal) == (1 if row.status in {s.value for s in TERMINAL} else 0)
                if terminal:
                    assert terminal[0] == len(log) - 1
                if task_id in self.finished:
                    assert self.finished[task_id] == (row.status, row.last_seq)
                elif row.status in {s.value for s in TERMINAL}:
                    self.finished[task_id] = (row.status, row.last_seq)
                if row.status in ("queued", "completed", "failed", "cancelled"):
                    assert row.owner_token is None

        @invariant()
        def one_owner_at_a_time(self) -> None:
            for task_id in self.task_ids:
                owner = self.row(task_id).owner_token
                believers = [w for w in self.workers if owner and w.held.get(task_id) == owner]
                assert len(believers) <= 1

    return Interleavings


@pytest.mark.usefixtures("model_id")
def test_random_interleavings_keep_every_invariant(database_url: str) -> None:
    machine = interleavings(database_url)
    machine.TestCase.settings = settings(
        max_examples=25, stateful_step_count=40, deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    machine.TestCase().runTest()
