"""The upstream client's own sockets (`core.engines.upstream.network`) under httpx: a
streamed body read as it comes, over TLS too, connections kept alive and dropped
when the server closed them, httpx's exceptions for refused, silent and broken
connections, and a cancelled request's connection closed at once."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from core.engines.upstream.network import asyncio_transport
from tests.upstream.helpers import self_signed, serving_tls
from tests.upstream.scripted import chunk, read_request

LIMITS = httpx.Limits(max_connections=4, max_keepalive_connections=4)
Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def _chunked(*pieces: bytes) -> bytes:
    return b"".join(chunk(piece) for piece in pieces) + b"0\r\n\r\n"


async def _streaming(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers requests on one connection, each a chunked body of three pieces."""
    while True:
        try:
            await read_request(reader)
        except asyncio.IncompleteReadError:
            writer.close()
            return
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for piece in (b"one ", b"two ", b"three"):
            writer.write(chunk(piece))
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
        await writer.drain()


async def _fetch(client: httpx.AsyncClient, url: str) -> tuple[bytes, list[bytes]]:
    async with client.stream("POST", url, json={"n": 1}) as response:
        pieces = [piece async for piece in response.aiter_bytes()]
    return b"".join(pieces), pieces


def _serve(answer: Answer, test: Callable[[str], Awaitable[None]],
           tls: ssl.SSLContext | None = None) -> None:
    async def run() -> None:
        server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=tls)
        port = server.sockets[0].getsockname()[1]
        async with server:
            await test(f"{'https' if tls else 'http'}://127.0.0.1:{port}/v1")

    asyncio.run(run())


def test_a_streamed_body_comes_read_by_read_on_a_kept_alive_connection() -> None:
    connections = 0

    async def counted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await _streaming(reader, writer)

    async def test(url: str) -> None:
        async with httpx.AsyncClient(transport=asyncio_transport(LIMITS)) as client:
            for _ in range(3):
                body, pieces = await _fetch(client, url)
                assert body == b"one two three"
                assert len(pieces) == 3  # one read each: nothing waits for the rest
        assert connections == 1

    _serve(counted, test)


def test_a_connection_the_server_closed_while_idle_is_not_reused() -> None:
    connections = 0

    async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + _chunked(b"done"))
        await writer.drain()
        writer.close()  # no Connection: close header: the client learns it from the socket

    async def test(url: str) -> None:
        async with httpx.AsyncClient(transport=asyncio_transport(LIMITS)) as client:
            for _ in range(2):
                assert (await _fetch(client, url))[0] == b"done"
                await asyncio.sleep(0.05)
        assert connections == 2

    _serve(once, test)


def test_tls_is_checked_and_carries_the_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key, cert = self_signed(tmp_path)
    served = serving_tls(key, cert)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)

    async def test(url: str) -> None:
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the operator's private CA
        async with httpx.AsyncClient(transport=asyncio_transport(LIMITS)) as client:
            assert (await _fetch(client, url))[0] == b"one two three"
        monkeypatch.delenv("SSL_CERT_FILE")
        async with httpx.AsyncClient(transport=asyncio_transport(LIMITS)) as client:
            with pytest.raises(httpx.ConnectError):  # not a certificate the system trusts
                await _fetch(client, url)

    _serve(_streaming, test, served)


def test_a_refused_connection_is_httpx_connect_error() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]

    async def run() -> None:
        async with httpx.AsyncClient(transport=asyncio_transport(LIMITS)) as client:
            with pytest.raises(httpx.ConnectError):
                await _fetch(client, f"http://127.0.0.1:{port}/v1")

    asyncio.run(run())


def test_a_silent_server_is_a_read_timeout_and_a_reset_is_a_transport_error() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        await asyncio.sleep(1)
        writer.close()

    async def broken(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nhalf")
        await writer.drain()
        writer.transport.abort()

    async def timing_out(url: str) -> None:
        async with httpx.AsyncClient(transport=asyncio_transport(LIMITS),
                                     timeout=httpx.Timeout(5, read=0.1)) as client:
            with pytest.raises(httpx.ReadTimeout):
                await _fetch(client, url)

    async def breaking(url: str) -> None:
        async with httpx.AsyncClient(transport=asyncio_transport(LIMITS)) as client:
            with pytest.raises(httpx.TransportError):
                await _fetch(client, url)

    _serve(silent, timing_out)
    _serve(broken, breaking)


def test_a_cancelled_request_closes_its_connection_at_once() -> None:
    streaming, closed = asyncio.Event(), asyncio.Event()

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nmore\r\n")
        await writer.drain()
        streaming.set()
        await reader.read()  # returns at the client's close
        closed.set()

    async def test(url: str) -> None:
        async with httpx.AsyncClient(transport=asyncio_transport(LIMITS)) as client:
            request = asyncio.ensure_future(_fetch(client, url))
            await asyncio.wait_for(streaming.wait(), 5)
            await asyncio.sleep(0.05)  # the client is waiting for its next read
            request.cancel()
            await asyncio.wait_for(closed.wait(), 1)

    _serve(endless, test)


def test_a_connection_closed_while_the_loop_was_busy_is_not_handed_out_again() -> None:
    """The server's close reaches the kernel before the loop's next turn tells the
    protocol, and a request sent in between would meet a closed connection. A server on
    a thread of its own answers a connection once, and closes it only once the client
    has read the answer and keeps its loop busy (a blocking sleep); then the client
    sends again."""
    accepted: list[socket.socket] = []
    answered = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        for _ in range(2):
            connection, _ = listener.accept()
            accepted.append(connection)
            connection.recv(65536)  # the request, small enough for one read
            connection.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                               + _chunked(b"done"))
            answered.wait(5)
            connection.close()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"

    async def run() -> None:
        async with httpx.AsyncClient(transport=asyncio_transport(LIMITS)) as client:
            assert (await _fetch(client, url))[0] == b"done"
            answered.set()
            time.sleep(0.2)  # the loop is busy: the close is in the kernel, not yet heard
            assert (await _fetch(client, url))[0] == b"done"

    try:
        asyncio.run(run())
        server.join(5)
        assert len(accepted) == 2
    finally:
        listener.close()
