"""Flushes of a worker's attempts due close together share one transaction: the first
calls the others due within the join window, waits for them (briefly), and each keeps
its own outcome; an attempt due later, or ending, is neither called nor waited for."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import cast

import pytest

from core.errors import LeaseLost
from core.settings import Settings
from core.store import worker_writes
from core.store.database import Database
from core.store.worker_writes import OutputWrite
from scheduler import flush_group
from scheduler.flush_group import GATHER_SECONDS, FlushGroup, join_window_ms
from tests.clocks import HandClock
from tests.engines import expected_text
from tests.scheduler.helpers import run_pass, streamed_text
from tests.store.helpers import assert_log_sound, new_task

INTERVAL_MS = 100
JOIN_MS = join_window_ms(INTERVAL_MS)  # a worker's window at that flush interval
LONG = 30.0  # a window no test may wait out
NOW_MS = 1_800_000_000_000


class _Store:
    """What a `FlushGroup` needs of its store: the clock; its writes are recorded."""

    def __init__(self) -> None:
        # The group's time stands still: which flushes are due within its window follows
        # from the tests' due times alone, not from how fast a loaded machine gets from a
        # test's `due` to its `write` (with the wall clock, that gap outran the window).
        self.clock = HandClock(NOW_MS)


@pytest.fixture
def groups(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The groups written, by task id; a write of owner "lost" fails its fence."""
    written: list[list[str]] = []

    def append_outputs(_db: Database, writes: Sequence[OutputWrite]) -> list[Exception | None]:
        written.append([w.task_id for w in writes])
        return [LeaseLost(w.task_id) if w.owner == "lost" else None for w in writes]

    monkeypatch.setattr(worker_writes, "append_outputs", append_outputs)
    return written


@pytest.fixture
def group() -> FlushGroup:
    return FlushGroup(cast(Database, _Store()), join_ms=JOIN_MS)


@pytest.fixture
def patient_group(monkeypatch: pytest.MonkeyPatch) -> FlushGroup:
    """A group whose leader waits for the attempts it called for as long as they take.

    A leader gives them `GATHER_SECONDS` (3 ms) to come; on a loaded machine a called
    runner's thread may start later than that (each then flushes alone, which the
    product allows), so the tests of who joins whose transaction use this group. Each
    of them lets every called attempt come, so no leader here waits out the window."""
    monkeypatch.setattr(flush_group, "GATHER_SECONDS", LONG)
    monkeypatch.setattr(flush_group, "_QUIET_SECONDS", LONG)
    return FlushGroup(cast(Database, _Store()), join_ms=JOIN_MS)


def write(task_id: str, owner: str = "owner") -> OutputWrite:
    return OutputWrite(task_id, owner, [], text=task_id)


def runner(group: FlushGroup, task_id: str, owner: str = "owner") -> tuple[
        Callable[[], None], threading.Event, list[BaseException]]:
    """A call that makes a thread flush `task_id` into the group, as its runner would;
    the event is set once that flush returned (its failure, if any, in the list)."""
    done, failures = threading.Event(), list[BaseException]()

    def flush() -> None:
        try:
            group.write(write(task_id, owner))
        except Exception as exc:
            failures.append(exc)
        done.set()

    return lambda: threading.Thread(target=flush).start(), done, failures


def now_ms() -> int:
    return NOW_MS


def test_a_flush_calls_the_attempts_due_within_the_window_into_its_transaction(
    patient_group: FlushGroup, groups: list[list[str]]
) -> None:
    call_b, b_done, b_failures = runner(patient_group, "b", owner="lost")
    patient_group.due("b", now_ms() + JOIN_MS // 2, call_b)
    patient_group.due("c", now_ms() + 10 * JOIN_MS, lambda: pytest.fail("c is not due soon"))
    patient_group.write(write("a"))
    assert b_done.wait(LONG)
    assert [sorted(g) for g in groups] == [["a", "b"]]
    assert [type(f) for f in b_failures] == [LeaseLost]  # its own outcome; a's is fine
    assert not patient_group.called("c")


def test_a_workers_groups_one_decode_step_apart_merge(
    patient_group: FlushGroup, groups: list[list[str]]
) -> None:
    """llama-server makes every busy stream's token in one decode step, ~26-30 ms apart
    at 4 streams on a 2-core machine: a stream whose flushes fell one step behind the
    others' is due that much after them at every interval. A worker's window (half the
    flush interval, `join_window_ms`) calls it into their transaction; a quarter did
    not, and it wrote alone at every interval (twice the write transactions per token,
    docs/benchmarks.md). A group due later than half an interval calls the other at its
    own flush, when the other is due within half: any two groups merge."""
    group = patient_group
    call_b, b_done, _ = runner(group, "b")
    group.due("b", now_ms() + 30, call_b)  # one decode step behind the leader
    group.write(write("a"))
    assert b_done.wait(LONG)
    call_a, a_done, _ = runner(group, "a")
    group.due("a", now_ms() + 40, call_a)  # due an interval after its flush, 60 before "c"'s
    group.write(write("c"))
    assert a_done.wait(LONG)
    assert [sorted(g) for g in groups] == [["a", "b"], ["a", "c"]]


def test_a_first_flush_calls_nobody_and_waits_for_nobody(
    group: FlushGroup, groups: list[list[str]]
) -> None:
    group.due("b", now_ms() + 1, lambda: pytest.fail("the first flush called b"))
    group.write(write("a"), call_others=False)
    assert groups == [["a"]]


def test_a_called_attempt_is_waited_for_only_until_it_is_written(
    patient_group: FlushGroup, groups: list[list[str]]
) -> None:
    called = threading.Event()
    patient_group.due("b", now_ms() + 1, called.set)
    leader = threading.Thread(target=patient_group.write, args=(write("a"),))
    leader.start()
    assert called.wait(LONG)
    assert patient_group.called("b")
    patient_group.write(write("b"))  # joins the gathering leader's group
    leader.join(LONG)
    assert [sorted(g) for g in groups] == [["a", "b"]]
    assert not patient_group.called("b")  # written: a late call of it is ignored


def test_a_called_attempt_that_ends_or_never_comes_does_not_hold_the_leader(
    group: FlushGroup, groups: list[list[str]]
) -> None:
    group.due("b", now_ms() + 1, lambda: group.due("b", None, lambda: None))  # it ends
    group.due("c", now_ms() + 1, lambda: None)  # a runner that never answers
    started = time.monotonic()
    group.write(write("a"))
    assert time.monotonic() - started < GATHER_SECONDS + 1.0
    assert groups == [["a"]]
    assert not group.called("b") and group.called("c")
    group.write(write("c"))  # comes later: a group of its own
    assert groups == [["a"], ["c"]]


@pytest.fixture
def parallel(fast: Settings) -> Iterator[Settings]:
    yield replace(fast, flush_interval_ms=100, flush_bytes=10_000)


def test_attempts_streaming_side_by_side_share_flush_transactions(
    db: Database, parallel: Settings, model_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's streams whose tokens come every 20 ms: flushes travel in groups, and
    each stream's log and text are whole."""
    sizes: list[int] = []
    append_outputs = worker_writes.append_outputs

    def recorded(db: Database, writes: Sequence[OutputWrite]) -> list[Exception | None]:
        sizes.append(len(writes))
        return append_outputs(db, writes)

    monkeypatch.setattr(worker_writes, "append_outputs", recorded)
    task_ids = [new_task(db, model_id, input="words=30 delay=0.02") for _ in range(4)]
    assert run_pass(db, parallel)["completed"] == 4
    for task_id in task_ids:
        assert streamed_text(db, task_id) == expected_text(30)
        assert_log_sound(db, task_id)
    assert max(sizes) >= 2, sizes
    assert len(sizes) < sum(sizes)
