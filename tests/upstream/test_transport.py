"""Reading an upstream's SSE body: `data:` payloads split out of bytes however the
network cuts them, handed over one batch per read, with failures after what came first."""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterator
from typing import Any

import httpx

from core.engines.upstream.transport import (
    END,
    MAX_LINE_BYTES,
    DataLines,
    _new_client,
    _pump,
)


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
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                writer.close()
                return
            lines = head.lower().split(b"\r\n")
            length = next((int(line.split(b":")[1]) for line in lines
                           if line.startswith(b"content-length:")), 0)
            await reader.readexactly(length)
            heads.append(lines)
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
