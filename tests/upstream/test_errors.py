"""Upstream failures end attempts with SPEC's codes (both stores, a real llama-server):
an unreachable server is retried, then dead-lettered; a refusal fails at once. And what
a broken upstream streams cannot wedge an attempt."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from core.settings import Settings
from core.states import Status
from core.store.database import Database
from core.store.tasks import get_response
from tests.scheduler.helpers import event_data, output_text, run_pass, streamed_text
from tests.scheduler.processes import free_port
from tests.store.helpers import task_row
from tests.upstream.helpers import add_upstream, enqueue
from tests.upstream.llama import LlamaServer
from tests.upstream.scripted import USAGE, Scripted, delta


def run_until_finished(db: Database, settings: Settings, task_id: str, seconds: float = 30) -> None:
    """Passes until the task is terminal: a pass ends while a retry waits for its backoff."""
    deadline = time.monotonic() + seconds
    while task_row(db, task_id).status not in (Status.COMPLETED, Status.FAILED,
                                                Status.CANCELLED):
        assert time.monotonic() < deadline, "the task did not finish"
        run_pass(db, settings)
        time.sleep(0.02)


def test_a_server_that_is_down_is_retried_then_dead_lettered(
    db: Database, quick: Settings
) -> None:
    closed = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    add_upstream(db, [closed])
    [task_id] = enqueue(db, max_attempts=3, max_output_tokens=4)

    run_until_finished(db, quick, task_id)

    row = task_row(db, task_id)
    assert (row.status, row.attempts, row.dead_lettered) == (Status.FAILED, 3, 1)
    assert row.error_code == "max_attempts_exceeded"
    retries = [e["error"]["code"] for e in event_data(db, task_id, "response.queued")]
    assert retries == ["upstream_unavailable"] * 2  # the third failure dead-letters it
    assert all(closed in e["error"]["message"] for e in event_data(db, task_id, "response.queued"))


def test_a_prompt_longer_than_the_context_fails_at_once(
    db: Database, quick: Settings, llama: LlamaServer
) -> None:
    add_upstream(db, [llama.base_url])
    [task_id] = enqueue(db, input="lighthouse " * 3000, max_output_tokens=4)

    run_until_finished(db, quick, task_id)

    row = task_row(db, task_id)
    assert (row.status, row.attempts, row.dead_lettered) == (Status.FAILED, 1, 0)
    assert row.error_code == "upstream_rejected"
    assert row.error_message == f"upstream {llama.base_url} answered 400"  # status, no body


def test_a_missing_key_variable_fails_at_once(db: Database, quick: Settings) -> None:
    add_upstream(db, ["http://127.0.0.1:9/v1"], api_key_env="TASKWARD_TEST_UNSET_KEY")
    [task_id] = enqueue(db, max_output_tokens=4)

    run_until_finished(db, quick, task_id)

    row = task_row(db, task_id)
    assert (row.status, row.error_code, row.attempts) == (Status.FAILED, "upstream_key_missing", 1)


def test_a_host_no_longer_allowed_is_refused_at_use(
    db: Database, quick: Settings, llama: LlamaServer
) -> None:
    add_upstream(db, [llama.base_url])  # accepted while any host was allowed
    [task_id] = enqueue(db, max_output_tokens=4)

    run_until_finished(db, replace(quick, upstream_allowed_hosts="*.internal"),
                       task_id)

    row = task_row(db, task_id)
    assert (row.status, row.error_code) == (Status.FAILED, "upstream_host_not_allowed")
    assert llama.busy_slots() == 0


def finished_behind(db: Database, settings: Settings, server: Scripted) -> str:
    """A task of at most four tokens run to its end against the stand-in `server`."""
    add_upstream(db, [server.base_url])
    [task_id] = enqueue(db, max_output_tokens=4)
    run_until_finished(db, settings, task_id, seconds=10)
    return task_id


def test_a_lone_surrogate_from_a_broken_upstream_is_stored_as_a_replacement(
    db: Database, quick: Settings, scripted: Callable[..., Scripted]
) -> None:
    """JSON can escape a lone surrogate that no UTF-8 text holds. A stand-in upstream (no
    real server sends one) streams it: the task completes with U+FFFD in its place. It
    used to crash every attempt where the output's size is measured, and the task hung
    until its lease ran out, then again on every retry."""
    lone = (b'data: {"choices": [{"index": 0, "delta": {"content": "ok \\ud800 end"}, '
            b'"finish_reason": null}]}\n\n')
    server = scripted([delta("One "), lone, delta("", "stop"), USAGE, b"data: [DONE]\n\n"],
                      pause=0.01)

    task_id = finished_behind(db, quick, server)

    row = task_row(db, task_id)
    assert (row.status, row.attempts) == (Status.COMPLETED, 1)
    assert output_text(db, task_id) == streamed_text(db, task_id) == "One ok \ufffd end"


def test_a_token_count_beyond_the_store_from_a_broken_upstream_is_not_reported(
    db: Database, quick: Settings, scripted: Callable[..., Scripted]
) -> None:
    """A stand-in upstream (no real server reports one) reports 10**11 prompt tokens:
    the task completes as if that count were not reported. It used to fail every
    attempt's completion on PostgreSQL (out of range for its INTEGER column)."""
    usage = (b'data: {"choices": [], "usage": {"prompt_tokens": 100000000000, '
             b'"completion_tokens": 3}}\n\n')
    server = scripted([delta("One"), delta("", "stop"), usage, b"data: [DONE]\n\n"],
                      pause=0.01)

    task_id = finished_behind(db, quick, server)

    row = get_response(db, task_id, None)
    assert (row.status, row.attempts) == (Status.COMPLETED, 1)
    completed = event_data(db, task_id, "response.completed")
    assert completed  # the terminal event was logged
    assert (row.input_tokens, row.output_tokens) == (0, 3)


def test_an_upstream_that_streams_past_max_output_tokens_is_cut_at_the_limit(
    db: Database, quick: Settings, scripted: Callable[..., Scripted]
) -> None:
    """A stand-in upstream that ignores `max_tokens` (real servers stop there) streams
    thirty words for a limit of four: the task completes with four, not thirty."""
    server = scripted([delta(f" w{i}") for i in range(30)] + [delta("", "stop")], pause=0.005)

    task_id = finished_behind(db, quick, server)

    assert task_row(db, task_id).status == Status.COMPLETED
    assert output_text(db, task_id) == streamed_text(db, task_id) == " w0 w1 w2 w3"
