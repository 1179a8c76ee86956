"""One thread follows a worker's streaming attempts: their flushes due close together
share one transaction, each fenced on its own, and an attempt whose fence fails or
whose transaction fails ends alone while the others stream on. Real stores; the
streams come from the deterministic test engine (tests/engines.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest

from core.settings import Settings
from core.store import worker_writes
from core.store.database import Database
from core.store.worker_writes import OutputWrite
from tests.engines import expected_text
from tests.scheduler.helpers import run_pass, streamed_text
from tests.store.helpers import assert_log_sound, force, new_task, task_row

WORDS = 30


@pytest.fixture
def parallel(fast: Settings) -> Settings:
    """Flushes by time only, every 100 ms, for streams that take ~0.6 s."""
    return replace(fast, flush_interval_ms=100, flush_bytes=10_000)


def _streams(db: Database, model_id: str, count: int) -> list[str]:
    return [new_task(db, model_id, input=f"words={WORDS} delay=0.02") for _ in range(count)]


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
    task_ids = _streams(db, model_id, 4)
    assert run_pass(db, parallel)["completed"] == 4
    for task_id in task_ids:
        assert streamed_text(db, task_id) == expected_text(WORDS)
        assert_log_sound(db, task_id)
    assert max(sizes) >= 2, sizes
    assert len(sizes) < sum(sizes)


def test_a_refused_flush_ends_its_own_attempt_and_no_other_in_its_transaction(
    db: Database, parallel: Settings, model_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first shared flush finds one of its tasks taken by another owner: that write
    is refused and its attempt lost, while the rest of the transaction is written and
    the other streams complete whole."""
    taken: list[str] = []
    append_outputs = worker_writes.append_outputs

    def one_taken(db: Database, writes: Sequence[OutputWrite]) -> list[Exception | None]:
        if not taken and len(writes) >= 2:
            taken.append(writes[0].task_id)
            force(db, writes[0].task_id, owner_token="another-worker")
        return append_outputs(db, writes)

    monkeypatch.setattr(worker_writes, "append_outputs", one_taken)
    task_ids = _streams(db, model_id, 4)
    outcomes = run_pass(db, parallel)

    assert taken, "no flush was shared"
    assert outcomes["lost"] == 1 and outcomes["completed"] == 3, outcomes
    [lost] = taken
    assert task_row(db, lost).owner_token == "another-worker"
    assert_log_sound(db, lost)
    assert len(streamed_text(db, lost)) < len(expected_text(WORDS))
    for task_id in task_ids:
        if task_id != lost:
            assert streamed_text(db, task_id) == expected_text(WORDS)
            assert_log_sound(db, task_id)


def test_a_failed_transaction_loses_its_attempts_and_the_thread_goes_on(
    db: Database, parallel: Settings, model_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flush transaction that raises (the store gone for a moment) loses the attempts
    in it, as a runner's did; the thread follows the next streams as before."""
    append_outputs = worker_writes.append_outputs
    failed: list[list[str]] = []

    def failing_once(db: Database, writes: Sequence[OutputWrite]) -> list[Exception | None]:
        if not failed:
            failed.append([w.task_id for w in writes])
            raise ConnectionError("the store went away")
        return append_outputs(db, writes)

    monkeypatch.setattr(worker_writes, "append_outputs", failing_once)
    first = _streams(db, model_id, 2)
    outcomes = run_pass(db, parallel)
    [members] = failed
    assert outcomes["lost"] == len(members), outcomes
    assert outcomes["completed"] == 2 - len(members), outcomes
    assert set(members) <= set(first)

    later = _streams(db, model_id, 2)
    assert run_pass(db, parallel)["completed"] == 2
    for task_id in later:
        assert streamed_text(db, task_id) == expected_text(WORDS)
        assert_log_sound(db, task_id)

