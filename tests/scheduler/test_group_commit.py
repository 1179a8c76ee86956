"""Group commit: completions that end together share one write, each keeps its outcome."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from core.settings import Settings
from core.states import Status
from core.store import completion
from core.store.database import Database
from scheduler.group_commit import GroupCommit, GroupWriteFailed
from tests.scheduler.helpers import enqueue_many, output_text, run_pass
from tests.store.helpers import assert_log_sound, task_row

LONG = 30.0  # a window no test may wait out


class Recorder:
    """A `write_all` that records its groups and fails the items named in `refuse`."""

    def __init__(self, refuse: frozenset[str] = frozenset()) -> None:
        self.groups: list[list[str]] = []
        self.refuse = refuse

    def __call__(self, items: Sequence[str]) -> list[BaseException | None]:
        self.groups.append(list(items))
        return [KeyError(item) if item in self.refuse else None for item in items]


def submit_all(commit: GroupCommit[str], items: list[str]) -> dict[str, BaseException | None]:
    """Submit each item from its own thread, all at once; each item's outcome."""
    outcomes: dict[str, BaseException | None] = {}
    start = threading.Barrier(len(items))

    def run(item: str) -> None:
        start.wait()
        try:
            commit.submit(item)
            outcomes[item] = None
        except BaseException as exc:  # recorded for the assertions
            outcomes[item] = exc

    threads = [threading.Thread(target=run, args=(item,)) for item in items]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    return outcomes


def test_completions_that_end_together_are_written_as_one_group() -> None:
    write = Recorder()
    commit = GroupCommit(write, running=lambda: 4, gather_seconds=LONG, quiet_seconds=LONG)
    outcomes = submit_all(commit, ["a", "b", "c", "d"])
    assert outcomes == {"a": None, "b": None, "c": None, "d": None}
    assert [sorted(group) for group in write.groups] == [["a", "b", "c", "d"]]


def test_each_item_keeps_its_own_failure() -> None:
    write = Recorder(refuse=frozenset({"b"}))
    commit = GroupCommit(write, running=lambda: 3, gather_seconds=LONG, quiet_seconds=LONG)
    outcomes = submit_all(commit, ["a", "b", "c"])
    assert outcomes["a"] is None and outcomes["c"] is None
    assert isinstance(outcomes["b"], KeyError)


def test_a_lone_completion_never_waits() -> None:
    write = Recorder()
    commit = GroupCommit(write, running=lambda: 1, gather_seconds=LONG, quiet_seconds=LONG)
    started = time.monotonic()
    commit.submit("alone")
    assert time.monotonic() - started < 1
    assert write.groups == [["alone"]]


def test_a_leader_stops_gathering_once_nobody_joins_for_the_quiet_window() -> None:
    write = Recorder()
    # Two attempts run, but the other one is busy with a long generation.
    commit = GroupCommit(write, running=lambda: 2, gather_seconds=LONG, quiet_seconds=0.05)
    started = time.monotonic()
    commit.submit("first")
    assert time.monotonic() - started < 1
    assert write.groups == [["first"]]


def test_the_quiet_window_counts_from_the_latest_arrival() -> None:
    """Joiners do not wake the gathering leader one by one, yet each one that comes
    within the quiet window of the one before joins its group."""
    write = Recorder()
    quiet = 0.5
    commit = GroupCommit(write, running=lambda: 5, gather_seconds=LONG, quiet_seconds=quiet)
    leader = threading.Thread(target=commit.submit, args=("first",))
    started = time.monotonic()
    leader.start()
    joiners = []
    for n, item in enumerate(["second", "third"], start=1):
        # Each after 0.6 of a window: the last joins 1.2 windows after the leader.
        time.sleep(max(0.0, started + n * 0.6 * quiet - time.monotonic()))
        joiner = threading.Thread(target=commit.submit, args=(item,))
        joiner.start()
        joiners.append(joiner)
    for thread in [leader, *joiners]:
        thread.join(timeout=10)
    assert [sorted(group) for group in write.groups] == [["first", "second", "third"]]
    assert time.monotonic() - started < 1.2 * quiet + 2 * quiet  # closed one window later


def test_members_with_a_callback_go_on_and_the_leader_settles_them_after_each_write() -> None:
    """Completions that arrive during a write neither wait for it nor lead the next
    group: each submit (and `lead`) returns at once, the leader that is writing gathers
    them into the next group, and every member's callback runs on the leader's thread,
    after the write of its group has returned (a completion is never reported before
    its commit)."""
    writing, release = threading.Event(), threading.Event()
    groups: list[list[str]] = []
    settled: list[tuple[str, BaseException | None, int, int]] = []

    def write(items: Sequence[str]) -> list[BaseException | None]:
        groups.append(list(items))
        if len(groups) == 1:
            writing.set()
            release.wait(LONG)
        return [KeyError(item) if item == "b" else None for item in items]

    def callback(item: str) -> Any:
        return lambda failure: settled.append(
            (item, failure, len(groups), threading.get_ident()))

    running = [1]  # the first group is its leader alone; then the three that arrive
    commit = GroupCommit(write, running=lambda: running[0], gather_seconds=LONG,
                         quiet_seconds=LONG)
    def lead_first() -> None:
        commit.submit("first", callback("first"))
        commit.lead()

    leader = threading.Thread(target=lead_first)
    leader.start()
    assert writing.wait(10)
    running[0] = 3
    for item in "abc":
        started = time.monotonic()
        commit.submit(item, callback(item))  # from this thread: neither blocks
        commit.lead()  # someone leads: it writes this one
        assert time.monotonic() - started < 1
    assert settled == []  # nothing is reported while its write is out
    release.set()
    leader.join(timeout=10)
    assert groups == [["first"], ["a", "b", "c"]]
    assert [(item, group, ident) for item, _, group, ident in settled] == [
        ("first", 1, leader.ident), ("a", 2, leader.ident), ("b", 2, leader.ident),
        ("c", 2, leader.ident)]
    failures = {item: failure for item, failure, _, _ in settled}
    assert failures["a"] is None and failures["c"] is None
    assert isinstance(failures["b"], KeyError)


def test_a_failed_write_reaches_every_member_and_the_next_group_still_runs() -> None:
    calls: list[int] = []

    def flaky(items: Sequence[str]) -> list[BaseException | None]:
        calls.append(len(items))
        if len(calls) == 1:
            raise ConnectionError("database went away")
        return [None] * len(items)

    running = [2]
    commit = GroupCommit(flaky, running=lambda: running[0], gather_seconds=LONG,
                         quiet_seconds=LONG)
    outcomes = submit_all(commit, ["a", "b"])
    assert all(isinstance(outcome, GroupWriteFailed) for outcome in outcomes.values())
    assert all(isinstance(outcome.__cause__, ConnectionError) for outcome in outcomes.values()
               if outcome is not None)
    running[0] = 1
    commit.submit("later")  # the commit is usable again, nobody is left waiting
    assert calls == [2, 1]


def test_a_write_that_answers_for_too_few_items_fails_them_all() -> None:
    def short(items: Sequence[str]) -> list[BaseException | None]:
        return []

    commit = GroupCommit(short)
    with pytest.raises(GroupWriteFailed, match="every item"):
        commit.submit("x")


def test_an_interrupt_in_the_write_settles_every_member_then_goes_on_up() -> None:
    def interrupted(items: Sequence[str]) -> list[BaseException | None]:
        raise KeyboardInterrupt

    commit = GroupCommit(interrupted, running=lambda: 2, gather_seconds=LONG,
                         quiet_seconds=LONG)
    settled: list[BaseException | None] = []
    commit.submit("member", settled.append)  # goes on at once; the leader settles it
    with pytest.raises(KeyboardInterrupt):
        commit.submit("leader")
    [failure] = settled
    assert isinstance(failure, GroupWriteFailed)
    assert isinstance(failure.__cause__, KeyboardInterrupt)


def test_a_worker_completes_a_burst_of_short_tasks_in_shared_transactions(
    db: Database, fast: Settings, model_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    groups: list[int] = []
    complete_all = completion.complete_all

    def recording(database: Database, completions: Sequence[completion.Completion]) -> list[
            Exception | None]:
        groups.append(len(completions))
        return complete_all(database, completions)

    monkeypatch.setattr(completion, "complete_all", recording)
    ids = enqueue_many(db, model_id, 24)

    summary = run_pass(db, replace(fast, worker_concurrency=8))

    assert summary["completed"] == 24 and sum(groups) == 24
    assert len(groups) < 24  # timing decides the exact grouping; one per task is the bug
    for task_id in ids:
        assert task_row(db, task_id).status == Status.COMPLETED
        assert output_text(db, task_id) == "w0 "
        assert_log_sound(db, task_id)
