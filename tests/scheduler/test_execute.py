"""Executing one attempt: the event log it writes, failures, timeouts and fencing."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from freezegun import freeze_time

from core.engines.base import Chunk, Emit, EngineOptions, GenerationRequest, ModelSource
from core.engines.registry import register_engine
from core.models_registry import register
from core.settings import Settings
from core.states import OnRestart, Status
from core.store import claims, completion
from core.store.database import Database
from core.store.models import remove
from core.store.tasks import cancel, current_response
from scheduler import leases
from scheduler.attempt import Attempt, Outcome
from scheduler.execute import execute
from scheduler.workers import Workers
from tests.engines import expected_text
from tests.scheduler.helpers import event_data, output_text, run_pass, streamed_text
from tests.scheduler.processes import wait_until
from tests.store.helpers import (
    assert_log_sound,
    event_types,
    events_of,
    force,
    new_task,
    task_row,
)

SECRET_PROMPT = "words=2 the-secret-prompt"


def test_a_completed_task_writes_the_spec_event_sequence(
    db: Database, fast: Settings, model_id: str
) -> None:
    task_id = new_task(db, model_id, input="words=7")
    assert run_pass(db, fast)["completed"] == 1

    types = event_types(db, task_id)
    assert types[:5] == ["response.created", "response.loading", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert set(types[5:-4]) == {"response.output_text.delta"}
    assert types[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    [delta] = event_data(db, task_id, "response.output_text.delta")
    assert set(delta) == {"item_id", "output_index", "content_index", "delta"}
    [done] = event_data(db, task_id, "response.output_item.done")
    assert done["item"]["content"][0]["text"] == expected_text(7)
    assert done["item"]["status"] == "completed"
    assert output_text(db, task_id) == expected_text(7)
    assert_log_sound(db, task_id)


def test_deltas_are_flushed_when_they_reach_the_size_limit(
    db: Database, fast: Settings, model_id: str
) -> None:
    settings = replace(fast, flush_bytes=6, flush_interval_ms=60_000)
    task_id = new_task(db, model_id, input="words=10")
    run_pass(db, settings)
    deltas = event_data(db, task_id, "response.output_text.delta")
    assert [d["delta"] for d in deltas] == ["w0 w1 ", "w2 w3 ", "w4 w5 ", "w6 w7 ", "w8 w9 "]


def test_a_size_flush_is_not_held_back_while_chunks_trickle_in(
    db: Database, fast: Settings, model_id: str
) -> None:
    """The runner sleeps through chunks while text is pending (scheduler/inbox.py), but
    the chunk that reaches the flush size still wakes it: the same deltas as above,
    not one batch at the end (the interval alone would never come due)."""
    settings = replace(fast, flush_bytes=6, flush_interval_ms=60_000)
    task_id = new_task(db, model_id, input="words=10 delay=0.02")
    run_pass(db, settings)
    deltas = event_data(db, task_id, "response.output_text.delta")
    # The first text goes alone after `FIRST_FLUSH_MS` (2 ms, before "w1 " comes 20 ms
    # later), unless a loaded machine keeps the runner off a core that long: then its
    # write takes "w1 " along, and the size flushes pair the words as above.
    assert [d["delta"] for d in deltas] in (
        ["w0 ", "w1 w2 ", "w3 w4 ", "w5 w6 ", "w7 w8 ", "w9 "],
        ["w0 w1 ", "w2 w3 ", "w4 w5 ", "w6 w7 ", "w8 w9 "])


def test_deltas_are_flushed_by_time_between_chunks(
    db: Database, fast: Settings, model_id: str
) -> None:
    settings = replace(fast, flush_bytes=10_000, flush_interval_ms=100)
    task_id = new_task(db, model_id, input="words=10 delay=0.05")
    run_pass(db, settings)
    deltas = event_data(db, task_id, "response.output_text.delta")
    assert 3 <= len(deltas) <= 8  # ~0.5 s of chunks in 100 ms batches, not 10 of them
    assert streamed_text(db, task_id) == expected_text(10)


def test_an_attempt_records_when_its_last_flush_began_for_the_lease_keeper(
    db: Database, fast: Settings, model_id: str
) -> None:
    # The keeper leaves a cancel of an attempt that wrote recently to its next write.
    settings = replace(fast, flush_bytes=10_000, flush_interval_ms=50)
    task_id = new_task(db, model_id, input="words=6 delay=0.03")
    [claim] = claims.claim(db, limit=1, lease_ms=60_000, node_id="node-a")
    attempt = Attempt(claim, clock=db.clock, timeout_ms=60_000, lease_ms=60_000)
    assert attempt.wrote_at_ms is None

    assert execute(db, settings, attempt) is Outcome.COMPLETED

    *_, last_delta = [e for e in events_of(db, task_id)
                      if e.type == "response.output_text.delta"]
    assert attempt.wrote_at_ms is not None
    assert 0 <= last_delta.created_at - attempt.wrote_at_ms < 1_000


def test_a_resumed_task_continues_after_what_was_streamed_without_reopening_the_item(
    db: Database, fast: Settings, model_id: str
) -> None:
    task_id = new_task(db, model_id, input="words=40 delay=0.01", on_restart=OnRestart.RESUME)
    workers = Workers(db, fast)
    workers.claim()
    wait_until(lambda: len(streamed_text(db, task_id)) > 20, timeout=10, what="some deltas")
    workers.stop(drain_seconds=0)  # hand back mid-generation: snapshot and text kept

    row = task_row(db, task_id)
    assert (row.status, row.owner_token, row.attempts) == (Status.RUNNING, None, 0)
    before = output_text(db, task_id)
    assert json.loads(row.snapshot_json)["pos"] == len(before.split())

    assert run_pass(db, fast)["completed"] == 1
    assert streamed_text(db, task_id) == output_text(db, task_id) == expected_text(40)
    assert output_text(db, task_id).startswith(before)
    assert event_types(db, task_id).count("response.output_item.added") == 1
    assert task_row(db, task_id).attempts == 1
    assert_log_sound(db, task_id)


def test_a_retryable_engine_error_requeues_the_task_with_backoff(
    db: Database, fast: Settings, model_id: str
) -> None:
    task_id = new_task(db, model_id, input="words=3 fail=retryable fail_at=1")
    before = db.clock.now_ms()
    assert run_pass(db, fast)["requeued"] == 1
    row = task_row(db, task_id)
    assert (row.status, row.error_code, row.attempts) == (Status.QUEUED, "engine_error", 1)
    assert before + 500 <= row.run_at <= db.clock.now_ms() + 1000


def test_a_non_retryable_engine_error_fails_the_task_at_once(
    db: Database, fast: Settings, model_id: str
) -> None:
    task_id = new_task(db, model_id, input="words=3 fail=fatal fail_at=1")
    assert run_pass(db, fast)["failed"] == 1
    row = task_row(db, task_id)
    assert (row.status, row.error_code, row.dead_lettered) == (Status.FAILED, "bad_request", 0)


def test_a_retryable_failure_of_the_last_attempt_dead_letters_the_task(
    db: Database, fast: Settings, model_id: str
) -> None:
    task_id = new_task(db, model_id, input="words=3 fail=retryable fail_at=0", max_attempts=1)
    assert run_pass(db, fast)["dead_lettered"] == 1
    row = task_row(db, task_id)
    assert (row.status, row.error_code, row.dead_lettered) == (
        Status.FAILED, "max_attempts_exceeded", 1)


class _BrokenModel:
    def generate(self, request: GenerationRequest, snapshot: object,
                 should_stop: Callable[[], bool], emit: Emit | None = None) -> Iterator[Chunk]:
        raise ValueError(f"cannot handle {request.messages[-1]['content']}")


class _BrokenEngine:
    name = "test.broken"

    def __init__(self, options: EngineOptions) -> None:
        pass

    def load(self, model: ModelSource) -> _BrokenModel:
        return _BrokenModel()


def test_an_unexpected_engine_exception_is_a_retryable_engine_error_without_the_prompt(
    db: Database, fast: Settings
) -> None:
    register_engine("test.broken", _BrokenEngine)
    (fast.models_dir / "broken.bin").write_bytes(b"broken\n")
    register(db, fast.models_dir, "broken.bin", model_id="broken", engine="test.broken")
    task_id = new_task(db, "broken", input=SECRET_PROMPT)
    assert run_pass(db, fast)["requeued"] == 1
    row = task_row(db, task_id)
    assert row.error_code == "engine_error"
    assert "secret" not in row.error_message
    assert "secret" not in json.dumps(event_data(db, task_id, "response.queued"))


def test_an_undecodable_stored_request_fails_the_task_and_the_pass_goes_on(
    db: Database, fast: Settings, model_id: str
) -> None:
    broken = new_task(db, model_id)
    force(db, broken, request_json='{"input": 42}')
    healthy = new_task(db, model_id)
    summary = run_pass(db, fast)
    assert (summary["failed"], summary["completed"]) == (1, 1)
    row = task_row(db, broken)
    assert (row.status, row.error_code) == (Status.FAILED, "invalid_request")
    assert task_row(db, healthy).status == Status.COMPLETED


def test_a_task_whose_model_entry_is_gone_fails_with_model_not_found(
    db: Database, fast: Settings, model_id: str
) -> None:
    task_id = new_task(db, model_id)
    remove(db, model_id)
    run_pass(db, fast)
    assert task_row(db, task_id).error_code == "model_not_found"


def test_a_task_whose_model_file_changed_fails_with_model_digest_mismatch(
    db: Database, fast: Settings, model_id: str
) -> None:
    task_id = new_task(db, model_id)
    (fast.models_dir / "words.bin").write_bytes(b"a different model\n")
    run_pass(db, fast)
    row = task_row(db, task_id)
    assert (row.status, row.error_code) == (Status.FAILED, "model_digest_mismatch")


def test_an_attempt_past_the_execution_timeout_is_requeued_as_timeout(
    db: Database, fast: Settings, model_id: str
) -> None:
    # Real time, not a frozen clock: the hand-over of a long engine to its runner is
    # timed on the real monotonic clock, and the timeout must cut a 10 s generation.
    settings = replace(fast, task_timeout_seconds=0.5)
    task_id = new_task(db, model_id, input="words=2000 delay=0.005")
    started = time.monotonic()
    result = run_pass(db, settings)
    assert time.monotonic() - started < 5, "the attempt ran on past its timeout"
    assert result["requeued"] == 1
    row = task_row(db, task_id)
    assert (row.status, row.error_code) == (Status.QUEUED, "timeout")


def test_a_stale_worker_whose_lease_was_taken_over_writes_nothing(
    db: Database, fast: Settings, model_id: str
) -> None:
    task_id = new_task(db, model_id, input="words=5")
    with freeze_time(datetime.now(UTC)) as frozen:
        [stale] = claims.claim(db, limit=1, lease_ms=5_000, node_id="old")
        frozen.tick(5.001)
        assert leases.expire(db)["queued"] == 1
        [fresh] = claims.claim(db, limit=1, lease_ms=60_000, node_id="new")
    last_seq = task_row(db, task_id).last_seq

    outcome = execute(db, fast, Attempt(stale, clock=db.clock, timeout_ms=60_000,
                                            lease_ms=60_000))

    assert outcome is Outcome.LOST
    row = task_row(db, task_id)
    assert (row.status, row.owner_token, row.last_seq) == (
        Status.LOADING, fresh.owner_token, last_seq)
    with pytest.raises(Exception, match="no longer held"):
        completion.complete(db, task_id, stale.owner_token, [], usage=stale.usage)


def test_a_worker_that_loses_its_lease_stops_at_the_next_heartbeat(
    db: Database, fast: Settings, model_id: str
) -> None:
    settings = replace(fast, heartbeat_seconds=0.2)
    task_id = new_task(db, model_id, input="words=500 delay=0.01")
    workers = Workers(db, settings)
    workers.claim()
    wait_until(lambda: streamed_text(db, task_id), timeout=10, what="the first delta")
    force(db, task_id, owner_token="someone-else")
    last_seq = task_row(db, task_id).last_seq
    assert workers.wait_idle(5)
    workers.stop(drain_seconds=0)
    assert workers.outcomes[Outcome.LOST] == 1
    assert task_row(db, task_id).last_seq == last_seq


def test_cancelling_a_running_task_ends_in_cancelled_within_one_flush_interval(
    db: Database, fast: Settings, model_id: str
) -> None:
    settings = replace(fast, flush_interval_ms=200, heartbeat_seconds=4)
    task_id = new_task(db, model_id, input="words=500 delay=0.01")
    workers = Workers(db, settings)
    workers.claim()
    wait_until(lambda: streamed_text(db, task_id), timeout=10, what="the first delta")

    assert cancel(db, task_id, None).status_code == 202
    wait_until(lambda: task_row(db, task_id).status == Status.CANCELLED, timeout=5,
               what="cancelled")
    workers.stop(drain_seconds=0)

    *_, cancelling, cancelled = events_of(db, task_id)
    assert (cancelling.type, cancelled.type) == ("response.cancelling", "response.cancelled")
    # Timed by the service's own clock, from the cancel's commit to the last event: one
    # flush interval plus a transaction or two, whatever the test's polling adds.
    assert cancelled.created_at - cancelling.created_at < 200 + 150
    assert_log_sound(db, task_id)


def test_a_task_is_running_within_one_flush_interval_of_loading_even_before_output(
    db: Database, fast: Settings, model_id: str
) -> None:
    task_id = new_task(db, model_id, input="words=2 delay=1")
    workers = Workers(db, fast)  # flush interval 50 ms
    workers.claim()
    try:
        wait_until(lambda: task_row(db, task_id).status == Status.RUNNING, timeout=0.8,
                   what="running before the first chunk")
        assert streamed_text(db, task_id) == ""
    finally:
        workers.stop(drain_seconds=5)
    assert task_row(db, task_id).status == Status.COMPLETED
    assert event_types(db, task_id)[:3] == [
        "response.created", "response.loading", "response.in_progress"]


def test_a_generation_without_text_completes_with_one_empty_message(
    db: Database, fast: Settings, model_id: str
) -> None:
    task_id = new_task(db, model_id, input="words=0")
    workers = Workers(db, fast)
    workers.claim()
    assert workers.wait_idle(5)
    workers.stop(drain_seconds=0)
    with db.read() as conn:
        response = current_response(conn, task_id)
    assert response["status"] == "completed"
    # The log opened and closed one message item; the final object must show it.
    assert [part["text"] for item in response["output"] for part in item["content"]] == [""]
    assert event_types(db, task_id).count("response.output_item.done") == 1
