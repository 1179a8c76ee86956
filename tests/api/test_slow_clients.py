"""Slow clients cannot hold a real `taskward serve`: idle connections and stalled bodies
are closed after their timeouts, and a client leaving mid-body is not an error.

The timeouts are set to one second here; the defaults (30 s) are tested in
`tests/test_settings.py`. Not a store test: one SQLite file is enough.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.served import process, service_env, wait_ready
from tests.databases import copy_sqlite
from tests.scheduler.processes import free_port

TIMEOUT_SECONDS = 1
CLOSED_WITHIN = 5  # the timeout, plus the slack of a loaded 2-core machine


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path) -> Iterator[
        tuple[int, Path]]:
    workdir = tmp_path_factory.mktemp("slow-clients")
    env = {**service_env(copy_sqlite(sqlite_template, workdir / "taskward.db"),
                         workdir / "models"),
           "TASKWARD_HTTP_IDLE_TIMEOUT_SECONDS": str(TIMEOUT_SECONDS),
           "TASKWARD_HTTP_BODY_TIMEOUT_SECONDS": str(TIMEOUT_SECONDS)}
    port, log = free_port(), workdir / "serve.log"
    with process(["serve", "--port", str(port)], env, log) as child:
        wait_ready(f"http://127.0.0.1:{port}", child, log)
        yield port, log


def seconds_until_closed(port: int, sent: bytes) -> tuple[float, bytes]:
    """Send `sent`, then read until the server closes; (seconds it took, what it said)."""
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.settimeout(CLOSED_WITHIN * 4)
        if sent:
            conn.sendall(sent)
        started, answer = time.monotonic(), b""
        while chunk := conn.recv(65536):
            answer += chunk
        return time.monotonic() - started, answer


def test_an_idle_connection_is_closed_after_the_idle_timeout(served: tuple[int, Path]) -> None:
    took, answer = seconds_until_closed(served[0], b"")
    assert took < CLOSED_WITHIN and answer == b""


def test_trickled_headers_are_closed_after_the_idle_timeout(served: tuple[int, Path]) -> None:
    took, _ = seconds_until_closed(served[0], b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    assert took < CLOSED_WITHIN


def test_an_unused_keep_alive_connection_is_closed(served: tuple[int, Path]) -> None:
    took, answer = seconds_until_closed(served[0], b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200") and took < CLOSED_WITHIN


def test_a_stalled_body_gets_408_and_is_closed(served: tuple[int, Path]) -> None:
    head = (b"POST /v1/pair HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n{")
    took, answer = seconds_until_closed(served[0], head)
    assert answer.startswith(b"HTTP/1.1 408") and b'"code":"body_timeout"' in answer
    assert took < CLOSED_WITHIN


def test_a_client_leaving_mid_body_is_not_logged_as_an_error(served: tuple[int, Path]) -> None:
    port, log = served
    before = log.read_text()
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(b"POST /v1/pair HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"code\": ")
        time.sleep(0.3)
    time.sleep(0.5)
    added = log.read_text()[len(before):]
    assert "500" not in added and "Traceback" not in added and "ERROR" not in added
