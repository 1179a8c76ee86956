"""Reading an upstream's SSE body: `data:` payloads split out of bytes however the
network cuts them, handed over one batch per read, with failures after what came first;
after `[DONE]` the connection kept for the next request (the body's end read without
holding the attempt up), and a request met by a kept connection the upstream had just
closed sent again."""

from __future__ import annotations

import asyncio
import queue
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from core.engines.upstream.transport import (
    DRAIN_BYTES,
    END,
    MAX_LINE_BYTES,
    RESENDS,
    DataLines,
    _new_client,
    _pump,
)
from tests.upstream.scripted import chunk, read_request


def fed(*pieces: bytes) -> list[bytes]:
    lines = DataLines()
    return [payload for piece in pieces for payload in lines.feed(piece)]


def test_payloads_are_whole_however_the_body_is_cut() -> None:
    body = b'data: {"a": 1}\n\ndata: {"b": "\xc3\xa9"}\n\ndata: [DONE]\n\n'
    whole = fed(body)
    assert whole == [b'{"a": 1}', b'{"b": "\xc3\xa9"}', b"[DONE]"]
    assert fed(*(body[i:i + 1] for i in range(len(body)))) == whole  # byte by byte


def test_every_line_ending_counts_and_other_lines_are_skipped() -> None:
    assert fed(b": keep-alive\r\nevent: x\r\ndata: 1\r", b"\ndata:2\rdata: 3\n") == [
        b"1", b"2", b"3"]


def test_a_line_still_open_waits_for_its_end() -> None:
    lines = DataLines()
    assert lines.feed(b"data: 12") == []
    assert lines.feed(b"34\n") == [b"1234"]


def pumped(*pieces: bytes) -> list[Any]:
    """What `_pump` hands the engine thread for a 200 answer streaming `pieces`."""

    async def body() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece

    async def run() -> list[Any]:
        transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body()))
        into: queue.SimpleQueue[Any] = queue.SimpleQueue()
        async with httpx.AsyncClient(transport=transport) as client:
            await _pump(client, "http://upstream.test/v1/chat/completions", {}, {},
                        httpx.Timeout(5), into)
        return [into.get_nowait() for _ in range(into.qsize())]

    return asyncio.run(run())


def test_one_read_is_one_batch_and_the_stream_ends_at_done() -> None:
    assert pumped(b'data: {"n": 1}\n\ndata: {"n": 2}\n\n', b'data: {"n": 3}\n\n',
                  b"data: [DONE]\n\ndata: {\"n\": 4}\n\n") == [
        [{"n": 1}, {"n": 2}], [{"n": 3}], END]


def test_a_broken_payload_comes_after_what_its_read_brought_before_it() -> None:
    items = pumped(b'data: {"n": 1}\n\ndata: {broken\n\n')
    assert items[0] == [{"n": 1}]
    assert isinstance(items[1], ValueError)
    assert items[2:] == [END]


def test_a_line_that_never_ends_breaks_the_stream_instead_of_growing() -> None:
    """An upstream that never ends a line (a broken or hostile one) would grow the buffer
    without bound; past `MAX_LINE_BYTES` the stream ends as broken, after what came
    before. A long line within the bound is read whole."""
    piece = b"x" * 65536
    long_enough = MAX_LINE_BYTES // len(piece)
    items = pumped(b'data: {"n": 1}\n\n', b"data: " + piece, *[piece] * long_enough)
    assert items[0] == [{"n": 1}]
    assert isinstance(items[1], ValueError)
    assert items[2:] == [END]
    within = b'data: "' + b"y" * (MAX_LINE_BYTES - 100) + b'"\n\n'
    assert pumped(*(within[i:i + 65536] for i in range(0, len(within), 65536))) == [
        ["y" * (MAX_LINE_BYTES - 100)], END]


def heads_of_two_requests() -> list[list[bytes]]:
    """The header lines (lowercased) of two requests the process's client (`_new_client`)
    sends in turn to a stand-in upstream (a server a user does not run: any HTTP server)
    that sets a cookie on every answer."""
    heads: list[list[bytes]] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head, _ = await read_request(reader)
            except asyncio.IncompleteReadError:
                writer.close()
                return
            heads.append(head.split(b"\r\n"))
            writer.write(b"HTTP/1.1 200 OK\r\nSet-Cookie: lb=node-1; Path=/\r\n"
                         b"Content-Length: 0\r\n\r\n")
            await writer.drain()

    async def run() -> None:
        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            client = await _new_client(httpx.Limits(max_connections=2))
            async with client:
                for _ in range(2):
                    got = await client.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                                            json={})
                    assert got.headers["set-cookie"].startswith("lb=")

    asyncio.run(run())
    return heads


def test_the_client_asks_for_an_uncompressed_body() -> None:
    asked = [[line for line in head if line.startswith(b"accept-encoding:")]
             for head in heads_of_two_requests()]
    assert asked == [[b"accept-encoding: identity"]] * 2


def test_a_cookie_an_upstream_sets_is_not_sent_on_the_next_request() -> None:
    """The one client serves every attempt of every client: a cookie from one answer
    (a load balancer's, say) must not ride along on the others."""
    carried = [b"".join(line for line in head if line.startswith(b"cookie:"))
               for head in heads_of_two_requests()]
    assert carried == [b"", b""]


# Connections kept across requests: each stand-in below serves one route over HTTP/1.1
# (not an inference server, which a user runs and tests/upstream/test_service.py
# drives: these misbehave exactly so).
DELTA = b'data: {"n": 1}\n\n'
DONE = b"data: [DONE]\n\n"


@dataclass
class Seen:
    """What a stand-in saw, and when the engine's side heard END (monotonic seconds)."""

    connections: int = 0
    requests: int = 0
    ended_at: float = 0.0  # when the last body's end was written, if it was
    items: list[list[Any]] = field(default_factory=list)  # each pump's items
    ends: list[float] = field(default_factory=list)  # when each pump put END


class _Timed(queue.SimpleQueue[Any]):
    def __init__(self, seen: Seen) -> None:
        self._seen = seen

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        if item is END:
            self._seen.ends.append(time.monotonic())
        super().put(item, block, timeout)


async def _request(reader: asyncio.StreamReader, seen: Seen) -> bool:
    """Read one request; False when the client closed the connection instead."""
    try:
        await read_request(reader)
    except (asyncio.IncompleteReadError, ConnectionError):
        return False
    seen.requests += 1
    return True


Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter, Seen], Awaitable[None]]


def pumps(count: int, answer: Answer) -> Seen:
    """`count` requests in turn through `_pump` and the process's kind of client, to a
    stand-in answering each connection with `answer`."""
    seen = Seen()

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.connections += 1
        try:
            await answer(reader, writer, seen)
        finally:
            writer.close()

    async def run() -> None:
        server = await asyncio.start_server(connection, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/chat/completions"
        async with server, await _new_client(httpx.Limits(max_connections=2)) as client:
            for _ in range(count):
                into = _Timed(seen)
                await _pump(client, url, {}, {}, httpx.Timeout(5), into)
                seen.items.append([into.get_nowait() for _ in range(into.qsize())])

    asyncio.run(run())
    return seen


async def _answers_then_ends_late(reader: asyncio.StreamReader,
                                  writer: asyncio.StreamWriter, seen: Seen) -> None:
    """Every request on the connection answered; the body's end 0.2 s after [DONE]."""
    while await _request(reader, seen):
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + chunk(DELTA) + chunk(DONE))
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        seen.ended_at = time.monotonic()


def test_after_done_the_connection_serves_the_next_request_and_nobody_waits() -> None:
    seen = pumps(3, _answers_then_ends_late)
    assert seen.items == [[[{"n": 1}], END]] * 3
    assert seen.connections == 1  # kept: not a new connection (and handshake) per request
    assert seen.ends[-1] < seen.ended_at - 0.1  # END came at [DONE], not at the body's end


async def _never_ends(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      seen: Seen) -> None:
    """Answers, then sends nothing after [DONE] until the client closes."""
    if await _request(reader, seen):
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + chunk(DELTA) + chunk(DONE))
        await writer.drain()
        await reader.read()  # returns when the client closes


async def _floods_after_done(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                             seen: Seen) -> None:
    """Answers, then streams more than `DRAIN_BYTES` after [DONE] without ending."""
    if await _request(reader, seen):
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + chunk(DELTA) + chunk(DONE))
        try:
            for _ in range(DRAIN_BYTES // 1024 + 10):
                writer.write(chunk(b"x" * 1024))
                await writer.drain()
            await reader.read()
        except ConnectionError:
            pass  # the client closed it: what this stand-in is for


@pytest.mark.parametrize("answer", [_never_ends, _floods_after_done])
def test_a_body_that_does_not_end_after_done_is_closed_not_kept(
    answer: Answer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("core.engines.upstream.transport.DRAIN_SECONDS", 0.2)
    started = time.monotonic()
    seen = pumps(2, answer)
    assert seen.items == [[[{"n": 1}], END]] * 2
    assert seen.connections == 2  # the first was closed, not handed out again
    assert time.monotonic() - started < 5


async def _hangs_up_on_a_second_request(reader: asyncio.StreamReader,
                                        writer: asyncio.StreamWriter, seen: Seen) -> None:
    """Answers one request whole, then closes the connection at the next one unanswered:
    what a close that crossed the client's reuse of the connection comes to."""
    if await _request(reader, seen):
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + chunk(DELTA) + chunk(DONE) + b"0\r\n\r\n")
        await writer.drain()
        await _request(reader, seen)


def test_a_request_met_by_a_closed_kept_connection_is_sent_again() -> None:
    seen = pumps(2, _hangs_up_on_a_second_request)
    assert seen.items == [[[{"n": 1}], END]] * 2  # no failure reaches the engine
    assert (seen.connections, seen.requests) == (2, 3)


async def _hangs_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    seen: Seen) -> None:
    await _request(reader, seen)


def test_an_upstream_that_hangs_up_on_every_request_fails_it_after_the_resends() -> None:
    seen = pumps(1, _hangs_up)
    [[failure, end]] = seen.items
    assert isinstance(failure, httpx.RemoteProtocolError) and end is END
    assert seen.requests == RESENDS + 1
