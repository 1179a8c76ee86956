"""The store contract, on SQLite and PostgreSQL alike: every operation, every fence."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from freezegun import freeze_time
from sqlalchemy import select

from core.engines.base import Usage
from core.errors import CancelRequested, Conflict, ForbiddenTransition, InvalidInput, LeaseLost
from core.idempotency import IdempotencyClaim
from core.objects import task_object
from core.states import ACTIVE, OnRestart, Status
from core.store import births, claims, completion, new_tasks, tasks, worker_writes
from core.store.database import EVENTS_CHANNEL, Database
from core.store.transitions import Event, move
from core.tables import idempotency_keys
from core.tables import tasks as tasks_table
from tests.store.helpers import assert_log_sound, event_types, events_of, new_task, task_row

LEASE = 30_000


def claim_one(db: Database, node: str = "node-a") -> claims.Claim:
    (claimed,) = claims.claim(db, limit=1, lease_ms=LEASE, node_id=node)
    return claimed


def run_to_running(db: Database, model_id: str, **fields: Any) -> claims.Claim:
    task_id = new_task(db, model_id, **fields)
    claimed = claim_one(db)
    assert claimed.task_id == task_id
    worker_writes.start_running(db, claimed.task_id, claimed.owner_token)
    return claimed


def delta(text: str) -> Event:
    return Event("response.output_text.delta", {"delta": text})


# --- enqueue ---------------------------------------------------------------------------

def test_enqueue_persists_task_response_and_first_event(db: Database, model_id: str) -> None:
    result = new_tasks.enqueue(db, births.NewTask(client_id="c", model=model_id,
                                                     request_json='{"model":"words","input":"x"}'))
    assert result.status_code == 202
    body = json.loads(result.body)
    assert body["id"] == result.task_id and body["status"] == "queued"
    row = task_row(db, result.task_id)
    assert (row.status, row.attempts, row.last_seq) == ("queued", 0, 1)
    assert event_types(db, result.task_id) == ["response.created"]


def test_enqueue_refuses_unknown_model_and_stores_nothing(db: Database, model_id: str) -> None:
    with pytest.raises(InvalidInput) as error:
        new_task(db, "no-such-model")
    assert error.value.code == "model_not_found"
    with db.read() as conn:
        assert conn.execute(select(tasks_table)).first() is None


def test_same_idempotency_key_and_request_replays_byte_identical(
    db: Database, model_id: str
) -> None:
    new = births.NewTask(client_id="c", model=model_id, request_json="{}")
    first = new_tasks.enqueue(db, new, idempotency=IdempotencyClaim("k1", "d1"))
    again = new_tasks.enqueue(db, new, idempotency=IdempotencyClaim("k1", "d1"))
    assert again.replayed and again.body == first.body and again.task_id == first.task_id
    with db.read() as conn:
        assert len(list(conn.execute(select(tasks_table)))) == 1


def test_same_idempotency_key_with_other_request_is_refused(db: Database, model_id: str) -> None:
    new = births.NewTask(client_id="c", model=model_id, request_json="{}")
    new_tasks.enqueue(db, new, idempotency=IdempotencyClaim("k1", "d1"))
    with pytest.raises(InvalidInput) as error:
        new_tasks.enqueue(db, new, idempotency=IdempotencyClaim("k1", "d2"))
    assert error.value.code == "idempotency_key_reused"


def test_idempotency_keys_are_scoped_per_client(db: Database, model_id: str) -> None:
    a = new_tasks.enqueue(db, births.NewTask(client_id="a", model=model_id, request_json="{}"),
                          idempotency=IdempotencyClaim("k", "d"))
    b = new_tasks.enqueue(db, births.NewTask(client_id="b", model=model_id, request_json="{}"),
                          idempotency=IdempotencyClaim("k", "d"))
    assert a.task_id != b.task_id and not b.replayed


def test_expired_idempotency_key_creates_a_new_task(db: Database, model_id: str) -> None:
    new = births.NewTask(client_id="c", model=model_id, request_json="{}")
    with freeze_time("2026-01-01 00:00:00"):
        first = new_tasks.enqueue(db, new, idempotency=IdempotencyClaim("k", "d"),
                                  idempotency_ttl_ms=1000)
    with freeze_time("2026-01-01 00:00:02"):
        second = new_tasks.enqueue(db, new, idempotency=IdempotencyClaim("k", "d"),
                                   idempotency_ttl_ms=1000)
    assert second.task_id != first.task_id and not second.replayed


def test_failed_creation_stores_no_idempotency_record(db: Database, model_id: str) -> None:
    new = births.NewTask(client_id="c", model="missing", request_json="{}")
    with pytest.raises(InvalidInput):
        new_tasks.enqueue(db, new, idempotency=IdempotencyClaim("k", "d"))
    with db.read() as conn:
        assert conn.execute(select(idempotency_keys)).first() is None


def test_dedupe_key_keeps_one_active_task(db: Database, model_id: str) -> None:
    first = new_task(db, model_id, dedupe_key="nightly")
    hit = new_tasks.enqueue(db, births.NewTask(client_id="client-a", model=model_id,
                                                  request_json="{}", dedupe_key="nightly"))
    assert hit.dedupe_hit and hit.status_code == 200 and hit.task_id == first


def test_dedupe_hit_with_idempotency_key_stores_no_record(db: Database, model_id: str) -> None:
    new_task(db, model_id, dedupe_key="nightly")
    new_tasks.enqueue(db, births.NewTask(client_id="client-a", model=model_id,
                                            request_json="{}", dedupe_key="nightly"),
                      idempotency=IdempotencyClaim("k", "d"))
    with db.read() as conn:
        assert conn.execute(select(idempotency_keys)).first() is None


def test_dedupe_key_is_free_again_once_the_task_finished(db: Database, model_id: str) -> None:
    first = new_task(db, model_id, dedupe_key="nightly")
    tasks.cancel(db, first, None)
    second = new_task(db, model_id, dedupe_key="nightly")
    assert second != first


def test_future_run_at_delays_the_claim(db: Database, model_id: str) -> None:
    with freeze_time("2026-01-01 00:00:00"):
        new_task(db, model_id, run_at=db.clock.now_ms() + 60_000)
        assert claims.claim(db, limit=5, lease_ms=LEASE, node_id="n") == []
    with freeze_time("2026-01-01 00:01:00"):
        assert len(claims.claim(db, limit=5, lease_ms=LEASE, node_id="n")) == 1


# --- claim ------------------------------------------------------------------------------

def test_claim_takes_oldest_first_up_to_the_limit(db: Database, model_id: str) -> None:
    ids = [new_task(db, model_id) for _ in range(3)]
    claimed = claims.claim(db, limit=2, lease_ms=LEASE, node_id="n")
    assert [c.task_id for c in claimed] == ids[:2]
    assert all(c.attempt == 1 and not c.resumed for c in claimed)
    row = task_row(db, ids[0])
    assert row.status == "loading" and row.owner_token and row.node_id == "n"
    assert event_types(db, ids[0]) == ["response.created", "response.loading"]
    assert json.loads(events_of(db, ids[0])[1].data) == {"attempt": 1}


def test_claim_dead_letters_a_task_whose_attempts_are_spent(db: Database, model_id: str) -> None:
    task_id = new_task(db, model_id, max_attempts=1)
    first = claim_one(db)
    worker_writes.requeue(db, first.task_id, first.owner_token, delay_ms=0, code="x", message="m")
    row = task_row(db, task_id)
    assert (row.status, row.dead_lettered, row.error_code) == ("failed", 1,
                                                               "max_attempts_exceeded")
    assert event_types(db, task_id)[-1] == "response.failed"
    assert_log_sound(db, task_id)


def test_claim_after_lease_expiry_dead_letters_when_attempts_spent(
    db: Database, model_id: str
) -> None:
    with freeze_time("2026-01-01 00:00:00"):
        task_id = new_task(db, model_id, max_attempts=1)
        claim_one(db)
    with freeze_time("2026-01-01 00:01:00"):
        from core.store.recovery import expire_leases

        assert expire_leases(db)["queued"] == 1
        assert claims.claim(db, limit=1, lease_ms=LEASE, node_id="n") == []
    row = task_row(db, task_id)
    assert row.status == "failed" and row.dead_lettered == 1
    assert_log_sound(db, task_id)


# --- the worker's fenced writes ------------------------------------------------------------

def test_progress_appends_events_snapshot_and_text_together(db: Database, model_id: str) -> None:
    claimed = run_to_running(db, model_id)
    worker_writes.append_output(db, claimed.task_id, claimed.owner_token, [delta("ab"), delta("c")],
                                text="abc", snapshot_json='{"pos": 2}', usage=Usage(3, 2))
    row = task_row(db, claimed.task_id)
    assert row.snapshot_json == '{"pos": 2}' and row.last_seq == 5
    with db.read() as conn:
        joined = tasks.response_in(conn, claimed.task_id, None)
    assert joined.output_text == "abc" and joined.output_tokens == 2
    assert_log_sound(db, claimed.task_id)


def test_flushes_of_several_attempts_share_a_transaction_each_fenced_alone(
    db: Database, model_id: str
) -> None:
    """A worker's flushes written together (`scheduler.stream_thread`): a write whose fence
    does not hold writes nothing and answers why; the others are written, the starts
    riding with them, and only the written ones are announced."""
    loaded_task = new_task(db, model_id)
    loaded = claim_one(db)
    assert loaded.task_id == loaded_task
    running = run_to_running(db, model_id)
    cancelled = run_to_running(db, model_id)
    tasks.cancel(db, cancelled.task_id, None)
    lost = run_to_running(db, model_id)
    before = {c.task_id: task_row(db, c.task_id).last_seq for c in (cancelled, lost)}
    heard: list[str] = []
    db.listen(EVENTS_CHANNEL, lambda news: heard.append(news.task_id))
    failures = worker_writes.append_outputs(db, [
        worker_writes.OutputWrite(loaded.task_id, loaded.owner_token, [delta("a")], text="a",
                                  snapshot_json='{"pos": 1}', usage=Usage(2, 1), start=True),
        worker_writes.OutputWrite(cancelled.task_id, cancelled.owner_token, [delta("x")],
                                  text="x", snapshot_json='{"pos": 9}'),
        worker_writes.OutputWrite(running.task_id, running.owner_token, [delta("b"), delta("c")],
                                  text="bc", snapshot_json='{"pos": 2}'),
        worker_writes.OutputWrite(lost.task_id, "0" * 32, [delta("y")], text="y"),
    ])
    assert [type(f) for f in failures] == [type(None), CancelRequested, type(None), LeaseLost]
    assert heard == [loaded.task_id, running.task_id]
    assert event_types(db, loaded.task_id)[-2:] == ["response.in_progress",
                                                    "response.output_text.delta"]
    assert task_row(db, loaded.task_id).status == "running"
    for claimed, text, snapshot in ((loaded, "a", '{"pos": 1}'), (running, "bc", '{"pos": 2}')):
        assert task_row(db, claimed.task_id).snapshot_json == snapshot
        with db.read() as conn:
            assert tasks.response_in(conn, claimed.task_id, None).output_text == text
        assert_log_sound(db, claimed.task_id)
    for claimed in (cancelled, lost):
        row = task_row(db, claimed.task_id)
        assert row.last_seq == before[claimed.task_id] and row.snapshot_json is None
        with db.read() as conn:
            assert tasks.response_in(conn, claimed.task_id, None).output_text == ""


def test_complete_writes_closing_events_and_the_terminal_one_last(
    db: Database, model_id: str
) -> None:
    claimed = run_to_running(db, model_id)
    completion.complete(db, claimed.task_id, claimed.owner_token,
                        [Event("response.output_text.done", {"text": ""})], usage=Usage(1, 1))
    row = task_row(db, claimed.task_id)
    assert row.status == "completed" and row.owner_token is None and row.finished_at
    assert event_types(db, claimed.task_id)[-2:] == ["response.output_text.done",
                                                     "response.completed"]
    assert_log_sound(db, claimed.task_id)


def test_a_stale_owner_cannot_write_anything(db: Database, model_id: str) -> None:
    claimed = run_to_running(db, model_id)
    stale = "0" * 32
    before = task_row(db, claimed.task_id).last_seq
    with pytest.raises(LeaseLost):
        worker_writes.append_output(db, claimed.task_id, stale, [delta("x")], text="x")
    with pytest.raises(LeaseLost):
        completion.complete(db, claimed.task_id, stale, [], usage=Usage())
    with pytest.raises(LeaseLost):
        worker_writes.heartbeat(db, claimed.task_id, stale, lease_ms=LEASE)
    with pytest.raises(LeaseLost):
        worker_writes.fail(db, claimed.task_id, stale, "x", "y")
    assert task_row(db, claimed.task_id).last_seq == before


def test_heartbeat_renews_the_lease(db: Database, model_id: str) -> None:
    with freeze_time("2026-01-01 00:00:00"):
        claimed = run_to_running(db, model_id)
    with freeze_time("2026-01-01 00:00:20"):
        assert worker_writes.heartbeat(db, claimed.task_id, claimed.owner_token,
                                       lease_ms=LEASE) is Status.RUNNING
        expected = db.clock.now_ms() + LEASE
    assert task_row(db, claimed.task_id).lease_expires_at == expected


def test_non_retryable_failure_fails_at_once(db: Database, model_id: str) -> None:
    claimed = run_to_running(db, model_id)
    worker_writes.fail(db, claimed.task_id, claimed.owner_token, "bad_request", "m" * 2000)
    row = task_row(db, claimed.task_id)
    assert (row.status, row.error_code, row.dead_lettered) == ("failed", "bad_request", 0)
    assert len(row.error_message) <= 500
    assert_log_sound(db, claimed.task_id)


def test_retryable_failure_requeues_with_the_given_delay(db: Database, model_id: str) -> None:
    with freeze_time("2026-01-01 00:00:00"):
        claimed = run_to_running(db, model_id)
        assert worker_writes.requeue(db, claimed.task_id, claimed.owner_token, delay_ms=5000,
                                     code="engine_error", message="boom")
        due = db.clock.now_ms() + 5000
    row = task_row(db, claimed.task_id)
    assert (row.status, row.run_at, row.owner_token) == ("queued", due, None)
    data = json.loads(events_of(db, claimed.task_id)[-1].data)
    assert data["reason"] == "retry" and data["attempt"] == 1
    assert data["run_at"] == "2026-01-01T00:00:05.000Z"  # RFC 3339, as a task's run_at
    assert data["error"] == {"code": "engine_error", "message": "boom"}
    assert row.error_code == "engine_error"  # why it waits, until the next attempt starts


def test_an_attempt_that_completes_after_a_failure_reports_no_error(
    db: Database, model_id: str
) -> None:
    claimed = run_to_running(db, model_id)
    worker_writes.requeue(db, claimed.task_id, claimed.owner_token, delay_ms=0,
                          code="timeout", message="the attempt exceeded the execution timeout")
    again = claim_one(db)
    assert task_row(db, again.task_id).error_code is None
    completion.complete(db, again.task_id, again.owner_token, [], usage=Usage(1, 1), start=True)
    row = task_row(db, again.task_id)
    assert (row.status, row.attempts, row.error_code, row.error_message) == (
        "completed", 2, None, None)
    with db.read() as conn:
        assert task_object(tasks.task_in(conn, again.task_id, None))["error"] is None


def test_a_requeued_task_starts_over_with_empty_output(db: Database, model_id: str) -> None:
    claimed = run_to_running(db, model_id)
    worker_writes.append_output(db, claimed.task_id, claimed.owner_token, [delta("ab")], text="ab",
                                snapshot_json='{"pos": 1}', usage=Usage(3, 1))
    worker_writes.requeue(db, claimed.task_id, claimed.owner_token, delay_ms=0, code="e",
                          message="m")
    again = claim_one(db)
    assert again.attempt == 2 and again.output_text == "" and again.snapshot_json is None
    with db.read() as conn:  # as stored, too: the claim cleared what the first attempt wrote
        response = tasks.response_in(conn, claimed.task_id, None)
    assert (response.output_text, response.input_tokens, response.output_tokens) == ("", 0, 0)


def test_release_refunds_the_attempt_and_requeues(db: Database, model_id: str) -> None:
    claimed = run_to_running(db, model_id)
    worker_writes.release(db, claimed.task_id, claimed.owner_token)
    row = task_row(db, claimed.task_id)
    assert (row.status, row.attempts, row.owner_token) == ("queued", 0, None)
    assert json.loads(events_of(db, claimed.task_id)[-1].data)["reason"] == "released"


def test_release_of_a_resume_task_keeps_its_snapshot_for_the_next_claim(
    db: Database, model_id: str
) -> None:
    claimed = run_to_running(db, model_id, on_restart=OnRestart.RESUME)
    worker_writes.append_output(db, claimed.task_id, claimed.owner_token, [delta("w0 ")],
                                text="w0 ", snapshot_json='{"pos": 1}')
    worker_writes.release(db, claimed.task_id, claimed.owner_token)
    row = task_row(db, claimed.task_id)
    assert (row.status, row.attempts, row.owner_token) == ("running", 0, None)
    resumed = claim_one(db)
    assert resumed.resumed and resumed.snapshot_json == '{"pos": 1}'
    assert resumed.output_text == "w0 " and resumed.attempt == 1
    assert event_types(db, claimed.task_id)[-1] == "response.in_progress"


# --- cancel -----------------------------------------------------------------------------

def test_cancel_of_a_queued_task_is_final_at_once(db: Database, model_id: str) -> None:
    task_id = new_task(db, model_id)
    outcome = tasks.cancel(db, task_id, "client-a")
    assert outcome.status_code == 200 and outcome.task.status == "cancelled"
    assert event_types(db, task_id) == ["response.created", "response.cancelled"]
    assert claims.claim(db, limit=1, lease_ms=LEASE, node_id="n") == []


def test_cancel_of_a_running_task_asks_the_worker_to_stop(db: Database, model_id: str) -> None:
    claimed = run_to_running(db, model_id)
    outcome = tasks.cancel(db, claimed.task_id, "client-a")
    assert outcome.status_code == 202 and outcome.task.status == "cancelling"
    assert tasks.cancel(db, claimed.task_id, "client-a").status_code == 202
    with pytest.raises(CancelRequested):
        worker_writes.append_output(db, claimed.task_id, claimed.owner_token, [delta("x")],
                                    text="x")
    with pytest.raises(CancelRequested):
        completion.complete(db, claimed.task_id, claimed.owner_token, [], usage=Usage())
    worker_writes.finish_cancelled(db, claimed.task_id, claimed.owner_token)
    assert task_row(db, claimed.task_id).status == "cancelled"
    assert event_types(db, claimed.task_id)[-2:] == ["response.cancelling", "response.cancelled"]
    assert_log_sound(db, claimed.task_id)


def test_cancel_of_a_finished_task_is_a_conflict(db: Database, model_id: str) -> None:
    claimed = run_to_running(db, model_id)
    completion.complete(db, claimed.task_id, claimed.owner_token, [], usage=Usage())
    with pytest.raises(Conflict) as error:
        tasks.cancel(db, claimed.task_id, "client-a")
    assert error.value.code == "task_already_finished"
    assert task_row(db, claimed.task_id).status == "completed"


def test_another_clients_task_is_not_found(db: Database, model_id: str) -> None:
    task_id = new_task(db, model_id, client="a")
    from core.errors import NotFound

    with pytest.raises(NotFound):
        tasks.cancel(db, task_id, "b")
    assert task_row(db, task_id).status == "queued"


# --- the state machine guards every move -------------------------------------------------

@pytest.mark.parametrize("target", [Status.RUNNING, Status.QUEUED, Status.CANCELLED,
                                    Status.LOADING, Status.FAILED])
def test_a_terminal_task_never_moves(db: Database, model_id: str, target: Status) -> None:
    claimed = run_to_running(db, model_id)
    completion.complete(db, claimed.task_id, claimed.owner_token, [], usage=Usage())
    with db.write() as conn:
        with pytest.raises(ForbiddenTransition):
            move(conn, now=1, expected={Status.COMPLETED}, to=target, events=[],
                 where=[tasks_table.c.id == claimed.task_id])
    assert task_row(db, claimed.task_id).status == "completed"


def test_a_move_from_an_unexpected_state_changes_nothing(db: Database, model_id: str) -> None:
    task_id = new_task(db, model_id)
    with db.write() as conn:
        rows = move(conn, now=1, expected={Status.RUNNING}, to=Status.COMPLETED,
                    events=[Event("response.completed")], where=[tasks_table.c.id == task_id])
    assert rows == []
    assert event_types(db, task_id) == ["response.created"]


def test_retry_of_a_dead_letter_makes_a_new_task(db: Database, model_id: str) -> None:
    claimed = run_to_running(db, model_id, max_attempts=1)
    worker_writes.requeue(db, claimed.task_id, claimed.owner_token, delay_ms=0, code="e",
                          message="m")
    returned = new_tasks.retry_failed(db, claimed.task_id, max_attempts=3)
    new = task_row(db, returned.id)
    assert new.status == "queued" and new.retry_of == claimed.task_id
    assert returned.status == "queued" and returned.retry_of == claimed.task_id
    assert task_row(db, claimed.task_id).status == "failed"


def dead_letter(db: Database, model_id: str, **fields: Any) -> str:
    claimed = run_to_running(db, model_id, max_attempts=1, **fields)
    worker_writes.requeue(db, claimed.task_id, claimed.owner_token, delay_ms=0, code="e",
                          message="m")
    assert task_row(db, claimed.task_id).status == "failed"
    return claimed.task_id


def test_a_retry_keeps_the_priority_and_the_dedupe_key(db: Database, model_id: str) -> None:
    """Both were dropped: an urgent task came back at the default priority, and two
    active tasks held one dedupe key."""
    failed = dead_letter(db, model_id, priority=1, dedupe_key="order-7")
    new = task_row(db, new_tasks.retry_failed(db, failed, max_attempts=3).id)
    assert (new.priority, new.dedupe_key) == (1, "order-7")


def test_a_retry_of_a_key_another_active_task_holds_is_a_conflict(
    db: Database, model_id: str
) -> None:
    failed = dead_letter(db, model_id, dedupe_key="order-7")
    holder = new_task(db, model_id, dedupe_key="order-7")
    with pytest.raises(Conflict) as refused:
        new_tasks.retry_failed(db, failed, max_attempts=3)
    assert refused.value.code == "dedupe_conflict"
    assert [row.id for row in active_rows(db)] == [holder]


def test_a_retry_asked_again_answers_the_active_retry(db: Database, model_id: str) -> None:
    """A double-click on Retry made two tasks doing the same work."""
    failed = dead_letter(db, model_id)
    first = new_tasks.retry_failed(db, failed, max_attempts=3)
    again = new_tasks.retry_failed(db, failed, max_attempts=3)
    assert again.id == first.id
    assert [row.id for row in active_rows(db)] == [first.id]


def test_retries_asked_at_the_same_instant_make_one_task(db: Database, model_id: str) -> None:
    """Each sees no active retry before it inserts: the store's unique index decides,
    and the losers answer the winner's task."""
    failed = dead_letter(db, model_id)
    start = threading.Barrier(6)

    def retry() -> str:
        start.wait()
        return str(new_tasks.retry_failed(db, failed, max_attempts=3).id)

    with ThreadPoolExecutor(6) as pool:
        answered = set(pool.map(lambda _: retry(), range(6)))
    assert len(answered) == 1
    assert [row.id for row in active_rows(db)] == list(answered)


def test_a_failed_retry_can_be_retried_again(db: Database, model_id: str) -> None:
    """Only an active retry is answered: once it failed too, a new one is made."""
    failed = dead_letter(db, model_id)
    first = new_tasks.retry_failed(db, failed, max_attempts=1)
    claimed = claim_one(db)
    assert claimed.task_id == first.id
    worker_writes.requeue(db, claimed.task_id, claimed.owner_token, delay_ms=0, code="e",
                          message="m")
    second = new_tasks.retry_failed(db, failed, max_attempts=3)
    assert second.id != first.id and task_row(db, second.id).status == "queued"


def active_rows(db: Database) -> list[Any]:
    with db.read() as conn:
        return list(conn.execute(select(tasks_table.c.id).where(
            tasks_table.c.status.in_(ACTIVE))))
