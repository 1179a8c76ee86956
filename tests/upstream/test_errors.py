"""Upstream failures end attempts with SPEC's codes (both stores, a real llama-server):
an unreachable server is retried, then dead-lettered; a refusal fails at once. And what
a broken upstream streams cannot wedge an attempt."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from core.settings import Settings
from core.states import Status
from core.store.database import Database
from core.store.tasks import get_response
from tests.scheduler.helpers import event_data, output_text, run_pass, streamed_text
from tests.scheduler.processes import free_port
from tests.store.helpers import task_row
from tests.upstream.helpers import add_upstream, enqueue, self_signed, serving_tls
from tests.upstream.llama import LlamaServer
from tests.upstream.scripted import USAGE, AnswersBadRequest, Scripted, delta


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
    # The third failure's cause is kept on the dead letter, in its message and event.
    assert row.error_message.startswith(
        "the task used all its attempts; the last failed with upstream_unavailable: upstream ")
    assert closed in row.error_message
    [failed] = event_data(db, task_id, "response.failed")
    assert failed["error"] == {"code": row.error_code, "message": row.error_message}


def retry_messages(db: Database, settings: Settings, base_url: str, **options: Any) -> list[str]:
    """The error messages of a two-attempt task against `base_url`, which must fail both."""
    add_upstream(db, [base_url], **options)
    [task_id] = enqueue(db, max_attempts=2, max_output_tokens=4)
    run_until_finished(db, settings, task_id)
    row = task_row(db, task_id)
    assert (row.status, row.attempts, row.error_code) == (Status.FAILED, 2,
                                                          "max_attempts_exceeded")
    return [e["error"]["message"] for e in event_data(db, task_id, "response.queued")]


def test_a_certificate_this_process_does_not_trust_is_named(
    db: Database, quick: Settings, scripted: Callable[..., Scripted], tmp_path: Path
) -> None:
    """A TLS upstream behind a private CA that `SSL_CERT_FILE` does not name: the
    operator reads a certificate problem, not "connection failed"."""
    key, cert = self_signed(tmp_path)
    server = scripted([delta("never read"), USAGE, b"data: [DONE]\n\n"],
                      tls=serving_tls(key, cert))

    messages = retry_messages(db, quick, server.base_url)

    assert messages == [f"upstream {server.base_url}: TLS certificate not trusted "
                        "(SSL_CERT_FILE names the CAs to trust)"]
    assert server.connections == 0  # no handshake completed


def test_https_to_a_server_that_waits_for_plain_http_is_a_handshake_timeout(
    db: Database, quick: Settings, llama: LlamaServer
) -> None:
    """A common slip, `https://` in the entry for a plain-HTTP server: llama-server
    waits for a request head and never answers the TLS hello."""
    mistyped = llama.base_url.replace("http://", "https://")

    messages = retry_messages(db, quick, mistyped, timeout_seconds=0.5)

    assert messages == [f"upstream {mistyped}: TLS handshake timed out"]


def test_https_to_a_server_that_answers_plain_http_is_a_failed_handshake(
    db: Database, quick: Settings
) -> None:
    """The same slip with a server that answers the TLS hello with a plain-HTTP 400, as
    uvicorn (vLLM's) does: a stand-in server that answers so to any bytes."""
    server = AnswersBadRequest()
    url = server.base_url.replace("http://", "https://")
    try:
        messages = retry_messages(db, quick, url)
    finally:
        server.stop()

    assert messages == [f"upstream {url}: TLS handshake failed"]


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
    add_upstream(db, ["http://127.0.0.1:9/v1"], api_key_env="UPSTREAM_TEST_UNSET_KEY")
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
