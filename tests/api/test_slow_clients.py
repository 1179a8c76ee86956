"""Slow clients cannot hold a real `taskward serve`: idle connections and stalled bodies
are closed after their timeouts, and a client leaving mid-body is not an error.

The timeouts are set to one second here; the defaults (30 s) are tested in
`tests/test_settings.py`. Not a store test: one SQLite file is enough.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar, post
from litestar.middleware import DefineMiddleware
from litestar.params import JSONBody

from handlers.arrivals import Arrivals
from handlers.errors import problem_details_plugin
from handlers.slow_clients import BodyTimeout, bounded_body_reads
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


def test_a_body_in_pieces_is_read_whole_and_the_connection_kept(
        served: tuple[int, Path]) -> None:
    """The piece completing `Content-Length` ends the body (no wait for the server's
    empty last piece), and the connection still serves the next request."""
    body = b'{"code": "none-such", "name": "x"}'
    head = (b"POST /v1/pair HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body))
    with socket.create_connection(("127.0.0.1", served[0])) as conn:
        conn.settimeout(CLOSED_WITHIN)
        conn.sendall(head + body[:10])
        time.sleep(0.3)
        conn.sendall(body[10:])
        first = _one_answer(conn)
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        second = _one_answer(conn)
    assert first.startswith(b"HTTP/1.1 4") and b"body_timeout" not in first
    assert second.startswith(b"HTTP/1.1 200")


def _one_answer(conn: socket.socket) -> bytes:
    """One HTTP/1.1 answer with a `Content-Length`, read off a kept-alive connection."""
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += conn.recv(65536)
    head, _, rest = answer.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(rest) < length:
        rest += conn.recv(65536)
    return head + b"\r\n\r\n" + rest


@pytest.mark.parametrize(("pieces", "receives"), [
    ([b'{"a": 1}', b""], 1),  # granian's two: the bytes, then an empty end
    ([b'{"a"', b": 1}", b""], 2),
])
def test_the_piece_completing_content_length_is_the_last(
        pieces: list[bytes], receives: int) -> None:
    """The app hears `more_body` false from the piece that brings the declared length:
    it never waits on the server's empty end."""
    sent = [{"type": "http.request", "body": piece, "more_body": i < len(pieces) - 1}
            for i, piece in enumerate(pieces)]
    heard: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return sent.pop(0)

    async def app(scope: object, receive: Any, send: object) -> None:
        while not heard or heard[-1]["more_body"]:
            heard.append(await receive())

    scope = {"type": "http", "headers": [(b"content-length", b"8")]}
    asyncio.run(bounded_body_reads(app, 1)(scope, receive, None))  # type: ignore[arg-type]
    assert len(heard) == receives and b"".join(m["body"] for m in heard) == b'{"a": 1}'


def test_a_stalled_read_ends_within_a_quarter_past_its_timeout_and_others_go_on() -> None:
    """One timer looks at every read: the stalled one gets `BodyTimeout` between its
    timeout and a quarter more; one that had its body carries on past the deadline."""
    timeout = 0.4

    async def stalled() -> dict[str, Any]:
        await asyncio.sleep(60)
        raise AssertionError("never")

    async def prompt() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def app(scope: object, receive: Any, send: object) -> None:
        await receive()
        await asyncio.sleep(timeout * 2)  # past the deadline, the body already read

    middleware = bounded_body_reads(app, timeout)  # one for both, as in a process

    async def timed(receive: Any) -> tuple[float, BaseException | None]:
        scope = {"type": "http", "headers": [(b"content-length", b"2")]}
        started = time.monotonic()
        try:
            await middleware(scope, receive, None)  # type: ignore[arg-type]
        except BodyTimeout as exc:
            return time.monotonic() - started, exc
        return time.monotonic() - started, None

    async def both() -> tuple[tuple[float, BaseException | None], ...]:
        return await asyncio.gather(timed(stalled), timed(prompt))

    (stalled_took, stalled_error), (prompt_took, prompt_error) = asyncio.run(both())
    assert isinstance(stalled_error, BodyTimeout)
    assert timeout <= stalled_took < timeout * 1.25 + 0.2  # + a loaded machine's slack
    assert prompt_error is None and prompt_took >= timeout * 2


class _Told(Arrivals):
    def __init__(self) -> None:
        super().__init__()
        self.told: list[str] = []

    def started(self, request: object) -> None:
        self.told.append("started")
        super().started(request)

    def finished(self, request: object) -> None:
        self.told.append("finished")
        super().finished(request)


@pytest.mark.parametrize("reads_its_body", [True, False])
def test_a_declared_body_is_on_its_way_until_read_or_its_request_ends(
        reads_its_body: bool) -> None:
    """What the group commit is told (`handlers.arrivals`): a body from its request's
    start until it has been read; one never read, until its request has ended."""
    arrivals = _Told()
    during: list[list[str]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def app(scope: object, receive: Any, send: object) -> None:
        if reads_its_body:
            await receive()
        during.append(list(arrivals.told))

    scope = {"type": "http", "headers": [(b"content-length", b"2")]}
    asyncio.run(bounded_body_reads(app, 1, arrivals)(scope, receive, None))  # type: ignore[arg-type]
    assert during == [["started", "finished"] if reads_its_body else ["started"]]
    assert arrivals.told[-1] == "finished"


@post("/echo")
async def _echo(data: JSONBody[dict[str, Any]]) -> dict[str, Any]:
    return data


class _Connection:
    """What a server hands a request: `receive` and `send` bound to one object, as
    granian's are to its request object, which holds the body stream (hyper closes a
    connection with its body unread only once that stream is dropped)."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = [{"type": "http.request", "body": p, "more_body": True} for p in pieces]
        self.statuses: list[int] = []

    async def receive(self) -> dict[str, Any]:
        if not self.pieces:
            await asyncio.sleep(60)  # the client stalls
        return self.pieces.pop(0)

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.statuses.append(message["status"])


@pytest.mark.parametrize(("pieces", "status"), [
    ([b'{"a": 1}'], 201),  # the whole body
    ([b'{"a"'], 408),  # then nothing: the body timeout ends it
])
def test_a_request_leaves_nothing_holding_its_connection(
        pieces: list[bytes], status: int) -> None:
    """Once a request has been answered, reference counting alone frees what the
    server bound `receive` to: a reference cycle through it would keep a stalled
    body's connection open until the cyclic collector happened to run."""
    app = Litestar([_echo], plugins=[problem_details_plugin()], middleware=[DefineMiddleware(
        bounded_body_reads, body_timeout_seconds=0.2, arrivals=Arrivals())])
    scope = {"type": "http", "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/echo", "raw_path": b"/echo", "root_path": "", "query_string": b"",
             "headers": [(b"content-type", b"application/json"), (b"content-length", b"8")],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80), "state": {}}

    async def answered() -> tuple[list[int], weakref.ref[_Connection]]:
        connection = _Connection(pieces)
        await app(scope, connection.receive, connection.send)  # type: ignore[arg-type]
        return connection.statuses, weakref.ref(connection)

    gc.collect()
    gc.disable()
    try:
        statuses, connection = asyncio.run(answered())
        assert statuses == [status] and connection() is None
    finally:
        gc.enable()
