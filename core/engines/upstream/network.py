"""The upstream client's sockets as plain asyncio protocols (an httpcore network backend).

httpx's default backend reaches the socket through anyio: every read of a streamed
token enters a cancel scope for its timeout (`fail_after`), a task-group aware receive
and an `asyncio.Event`, about a quarter of the upstream loop's CPU per read (the
transport alone: 116-138 us per read through anyio, 86-99 us here; docs/benchmarks.md,
"the sixth wave"). Here a read returns what the protocol has buffered, or waits on
one future with one timer for its timeout. Everything above the socket is still
httpcore's and httpx's (HTTP/1.1 parsing, pooling, content decoding,
their exceptions); failures come out as httpcore's exceptions, which httpx maps to its
own (`ConnectError`, `ReadTimeout`, ...), exactly as through anyio. Cancelling the
request's task closes the connection at once, as before.

What the socket received and nobody read yet is held up to `HIGH_WATER_BYTES`; beyond
it the connection stops reading from the kernel until a read takes it below, so a
stream its reader holds back (`core.engines.base.Room`) fills the kernel's buffers and TCP
slows the sender, instead of this buffer growing without end.
"""

from __future__ import annotations

import asyncio
import select
import ssl
from typing import Any

import httpcore
import httpx

_TLS_HANDSHAKE_SECONDS = 60.0  # asyncio's own default, when no timeout is given
HIGH_WATER_BYTES = 1 << 16  # httpcore's own read size: one read's worth waits, no more


class _Socket(asyncio.Protocol):
    """What the connection has received and not yet read, and who waits for more."""

    def __init__(self) -> None:
        self.received = bytearray()
        self.ended = False
        self.lost: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.drained: asyncio.Future[None] | None = None  # set while writing is paused
        # What reads the socket (the TLS layer's transport once there is one): paused
        # while `received` holds `HIGH_WATER_BYTES` or more.
        self.reading: asyncio.Transport | None = None
        self.paused = False

    def data_received(self, data: bytes) -> None:
        self.received += data
        if len(self.received) >= HIGH_WATER_BYTES and not self.paused:
            reading = self.reading
            if reading is not None and not reading.is_closing():
                reading.pause_reading()
                self.paused = True
        self._wake()

    def taken(self) -> None:
        """A read took from `received`: read from the socket again once below the mark."""
        if self.paused and len(self.received) < HIGH_WATER_BYTES:
            self.paused = False
            reading = self.reading
            if reading is not None and not reading.is_closing():
                reading.resume_reading()

    def eof_received(self) -> bool:
        self.ended = True
        self._wake()
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        self.lost = exc
        self._wake()
        self.resume_writing()

    def pause_writing(self) -> None:
        if self.drained is None:
            self.drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        drained, self.drained = self.drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


def _kernel_readable(transport: asyncio.Transport) -> bool:
    """Whether the socket holds what the loop has not handed to the protocol yet. An
    upstream that closes a connection after its answer (llama-server closes every one)
    has its close in the kernel well before the loop's next turn reports it, and the
    pool may hand the connection out in between; asked here, it is not reused."""
    sock = transport.get_extra_info("socket")
    descriptor = -1 if sock is None else sock.fileno()
    if descriptor < 0:
        return True  # gone: as good as closed
    poll = select.poll()
    poll.register(descriptor, select.POLLIN)
    return bool(poll.poll(0))


def _expire(future: asyncio.Future[None], error: Exception) -> None:
    if not future.done():
        future.set_exception(error)


class _Stream(httpcore.AsyncNetworkStream):
    def __init__(self, transport: asyncio.Transport, socket: _Socket) -> None:
        self._transport = transport
        self._socket = socket
        socket.reading = transport

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        socket = self._socket
        if not socket.received and not socket.ended:
            loop = asyncio.get_running_loop()
            waiter = socket.waiter = loop.create_future()
            timer = (None if timeout is None else
                     loop.call_later(timeout, _expire, waiter, httpcore.ReadTimeout("timed out")))
            try:
                await waiter
            finally:
                socket.waiter = None
                if timer is not None:
                    timer.cancel()
        received = socket.received
        if not received:
            if socket.lost is not None:
                raise httpcore.ReadError(str(socket.lost)) from socket.lost
            return b""
        if len(received) <= max_bytes:
            data = bytes(received)
            received.clear()
        else:
            data = bytes(received[:max_bytes])
            del received[:max_bytes]
        socket.taken()
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        if self._transport.is_closing():
            raise httpcore.WriteError("the connection is closed")
        self._transport.write(buffer)
        drained = self._socket.drained
        if drained is not None:
            try:
                await asyncio.wait_for(asyncio.shield(drained), timeout)
            except TimeoutError:
                raise httpcore.WriteTimeout("timed out") from None
            if self._socket.lost is not None:
                raise httpcore.WriteError(str(self._socket.lost))

    async def aclose(self) -> None:
        self._transport.close()

    async def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            transport = await loop.start_tls(
                self._transport, self._socket, ssl_context, server_hostname=server_hostname,
                ssl_handshake_timeout=timeout or _TLS_HANDSHAKE_SECONDS)
        except (TimeoutError, ConnectionAbortedError):  # asyncio's and uvloop's timeout
            self._transport.close()
            raise TlsHandshakeTimedOut("TLS handshake timed out") from None
        except (OSError, ssl.SSLError) as exc:
            self._transport.close()
            raise httpcore.ConnectError(str(exc)) from exc
        assert transport is not None  # None only for a server-side handshake
        return _Stream(transport, self._socket)

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":  # httpcore's test of an idle pooled connection
            return (bool(self._socket.received) or self._socket.ended
                    or _kernel_readable(self._transport))
        if info == "ssl_object":
            return self._transport.get_extra_info("ssl_object")
        if info in ("client_addr", "server_addr"):
            return self._transport.get_extra_info("sockname" if info == "client_addr"
                                                  else "peername")
        if info == "socket":
            return self._transport.get_extra_info("socket")
        return None


class TlsHandshakeTimedOut(httpcore.ConnectTimeout):
    """The server took the connection but did not finish a TLS handshake in time. Most
    often it speaks plain HTTP at an `https://` URL and waits for a request head that
    never comes (llama-server does). asyncio and uvloop end their own handshake
    timeout with a `ConnectionAbortedError`, which would read as "connection failed"."""


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    """TCP connections as `_Stream`s (no Unix sockets: upstreams are URLs)."""

    async def connect_tcp(
        self, host: str, port: int, timeout: float | None = None,
        local_address: str | None = None, socket_options: Any = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            transport, socket = await asyncio.wait_for(loop.create_connection(
                _Socket, host, port,
                local_addr=None if local_address is None else (local_address, 0)), timeout)
        except TimeoutError:
            raise httpcore.ConnectTimeout("timed out") from None
        except OSError as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        return _Stream(transport, socket)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def asyncio_transport(limits: httpx.Limits) -> httpx.AsyncHTTPTransport:
    """httpx's transport over `AsyncioBackend`: the same pool, limits and certificate
    checks as `httpx.AsyncHTTPTransport(limits=limits)`. The certificates trusted are
    httpx's: the CA file `SSL_CERT_FILE` or folder `SSL_CERT_DIR` names when set (an
    upstream behind a private CA, docs/upstream.md), certifi's public bundle otherwise;
    read here, once per process."""
    context = httpx.create_ssl_context()  # made once: ~30 ms of CPU
    transport = httpx.AsyncHTTPTransport(verify=context, limits=limits)
    # httpx builds its pool without a way to name the backend; this is that pool with it.
    # An httpx that keeps its pool elsewhere would silently ignore ours: refuse it.
    if not isinstance(getattr(transport, "_pool", None), httpcore.AsyncConnectionPool):
        raise RuntimeError("this httpx keeps no httpcore pool in `_pool`: "
                           "core/engines/upstream/network.py needs updating for it")
    transport._pool = httpcore.AsyncConnectionPool(
        ssl_context=context,
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        network_backend=AsyncioBackend())
    return transport
