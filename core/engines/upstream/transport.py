"""The process's one HTTP client for every upstream, on one event-loop thread.

Engine threads are blocking, but an upstream stream must close the moment a cancel or a
lost lease says so, also while the server is silent (a long prompt, a full queue): a
blocking read cannot be interrupted from another thread, an asyncio task can. So each
request runs as a task on this loop and hands its lines on (`Into`: to the engine's
relay, which makes them chunks on this thread); cancelling the task closes the
connection, and the server frees its slot.

A streamed token costs this loop one network read, so the read path is kept short: the
body is split into lines as bytes (no text decoding of what is not a `data:` line),
every payload of one read is handed on as one batch (one chunk, however many tokens
the read brought), the loop is uvloop where installed, as the API's is, and the
sockets are asyncio's own protocols rather than anyio's streams (`network`).

While the upstream is silent (a long prompt, a full queue) no read comes to say that
the attempt should stop, so each stream names a `watch`: one timer of this loop calls
every open stream's every `WATCH_SECONDS`, a wake-up of this thread for all of them,
instead of each attempt's engine thread waking on its own to look (measured: 20 wake-ups
a second per waiting attempt, for nothing). The timer runs only while a stream is open.

One pooled `httpx.AsyncClient` per process (re-created after a fork), redirects never
followed: a redirect could send the request, and its key, to a host nobody allowed;
cookies never kept, so nothing of one attempt's answer rides along on another's;
bodies asked for and read uncompressed (`open_stream`). A connection serves attempt
after attempt (a hosted API's TLS handshake is paid once, not per attempt): after
`[DONE]` the body is read to its end, which is what returns a connection to the pool;
one the upstream closed just as it was handed out is met by sending the request again
(`_send`). An answer its reader calls complete without `[DONE]` (`open_stream`'s
`complete`) ends there just the same.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from concurrent.futures import Future
from dataclasses import dataclass
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any, Protocol

import h11
import httpx

from core.engines.base import Room
from core.engines.upstream import protocol
from core.engines.upstream.network import asyncio_transport
from core.error_chain import error_chain
from core.thread_names import named_thread

_lock = threading.Lock()
_transport: _Transport | None = None


@dataclass(frozen=True)
class Status:
    """The upstream answered with something other than 200; its body is never read."""

    code: int
    retry_after: str | None


class Compressed:
    """The upstream answered 200 with a compressed body although asked for none; it is
    not read (`open_stream`)."""


class MalformedHead(ValueError):
    """The upstream answered with a head that cannot be parsed (a garbage status line,
    a transfer coding other than chunked, a head beyond h11's limit): an answer, broken
    like a malformed chunk, not a hang-up to send the request again for (`_send`)."""


END = object()  # the stream is over (after [DONE], or the connection ended)
WATCH_SECONDS = 0.05  # how soon a stop is seen while the upstream sends nothing
_DONE = b"[DONE]"
_LINE_ENDS = (b"\n", b"\r")
# An SSE line longer than this ends the stream as broken: an upstream that never ends a
# line would otherwise grow the buffer until the process runs out of memory. A chunk
# of a real server's stream is a few hundred bytes.
MAX_LINE_BYTES = 1 << 20
# After `[DONE]` (or what `complete` calls the end) the rest of the body (its last
# chunk, normally in the same read or the next) is read for at most this long and this
# much, so that the connection goes back to the pool; past either it is closed. END is
# put before, so the attempt never waits for it.
DRAIN_SECONDS = 1.0
DRAIN_BYTES = 1 << 16
# How a request meets a connection the upstream has just closed: it hangs up, or
# resets, before any answer (`_send`). Not a timeout, not a refused connection, not
# an answer whose head cannot be parsed (`MalformedHead`).
_UNANSWERED = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
RESENDS = 3


class Into(Protocol):
    """Where a stream's items go, called on this loop's thread (a `queue.SimpleQueue`,
    or the engine's relay, which turns each read into a chunk right here)."""

    def put(self, item: Any) -> None: ...


class _Transport:
    def __init__(self, max_connections: int) -> None:
        self.pid = os.getpid()
        self.loop = _new_loop()
        self._thread = named_thread(self.loop.run_forever, "upstream-http")
        self._thread.start()
        limits = httpx.Limits(max_connections=max_connections,
                              max_keepalive_connections=max_connections)
        self.client: httpx.AsyncClient = self.run(_new_client(limits)).result()
        self._watches: set[Callable[[], None]] = set()  # this loop's thread only
        self._watching: asyncio.TimerHandle | None = None

    def run(self, work: Coroutine[Any, Any, Any]) -> Future[Any]:
        return asyncio.run_coroutine_threadsafe(work, self.loop)

    def watch(self, watch: Callable[[], None]) -> None:
        """Call `watch` every `WATCH_SECONDS` until `unwatch(watch)` (on this loop)."""
        self._watches.add(watch)
        if self._watching is None:
            self._watching = self.loop.call_later(WATCH_SECONDS, self._call_watches)

    def unwatch(self, watch: Callable[[], None]) -> None:
        self._watches.discard(watch)

    def _call_watches(self) -> None:
        # The next tick is set first: a watch that raised must not end the others'.
        self._watching = (self.loop.call_later(WATCH_SECONDS, self._call_watches)
                          if self._watches else None)
        for watch in list(self._watches):
            watch()


def _new_loop() -> asyncio.AbstractEventLoop:
    """uvloop where installed (granian's `auto` picks it for the API too), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


async def _new_client(limits: httpx.Limits) -> httpx.AsyncClient:
    """Direct connections over asyncio's own sockets (`network`); a proxy named by the
    environment is still reached through httpx's own transport. No cookies kept: the
    client serves every attempt of every client, so a cookie one upstream answer set
    (a load balancer's, say) would ride along on the requests of all the others. Bodies
    asked for uncompressed (`open_stream`)."""
    no_cookies = CookieJar(policy=DefaultCookiePolicy(allowed_domains=[]))
    return httpx.AsyncClient(follow_redirects=False, limits=limits, cookies=no_cookies,
                             headers={"Accept-Encoding": "identity"},
                             transport=asyncio_transport(limits))


def _shared(max_connections: int) -> _Transport:
    global _transport
    with _lock:
        if _transport is None or _transport.pid != os.getpid():
            _transport = _Transport(max_connections)
        return _transport


def open_stream(
    url: str, body: dict[str, Any], headers: dict[str, str], timeout: httpx.Timeout,
    into: Into, *, max_connections: int, watch: Callable[[], None], room: Room | None = None,
    complete: Callable[[], bool] | None = None, opened: Callable[[], None] | None = None,
) -> Future[Any]:
    """POST `body` to `url` with `stream: true` and put into `into`, in order: a `Status`
    (then END) for a non-200 answer, `Compressed` (then END) for a compressed one, else
    lists of the `data:` payloads parsed as JSON (each list non-empty: what one read
    brought); then END. A transport failure is put as the exception itself, after the
    payloads read before it and before END.

    `opened` is called on this loop's thread when a 200 answer's head has come, before
    its body is read: from there the server's time is its own (the connection, its TLS
    handshake and the wait for the head are behind).

    `complete` is asked after each read that brought payloads, on this loop's thread:
    once it says yes, the stream is over as at `[DONE]` (END at once, the body's end
    read as after `[DONE]`). An upstream that keeps the connection open after its
    answer's end without `[DONE]` would otherwise hold the attempt until its timeout.

    The client asks for an uncompressed body: a decompressor inflates each read whole,
    so a small compressed read from a broken or hostile upstream could take the
    process's memory before any line limit applies; an inference server's event
    stream is not compressed anyway. The body is read raw, without a decoder.

    `watch` is called on this loop every `WATCH_SECONDS` while the stream is open.
    `room` is asked after each read that brought payloads, on this loop's thread: while
    it holds the stream back (the wake-up may come from any thread) nothing is read, so
    the socket's buffers fill (`network`) and TCP slows the upstream; `watch` goes on
    meanwhile, and no read timeout ends the wait (the upstream is not silent: this side
    is slow). Cancelling the returned future closes the
    connection at once: do it to leave a request before its END. After END the future
    may still be reading the body's end (`DRAIN_SECONDS`) to keep the connection; it
    needs nothing more from the caller."""
    transport = _shared(max_connections)
    return transport.run(_watched(transport, watch, url, body, headers, timeout, into, room,
                                  complete, opened))


async def _watched(
    transport: _Transport, watch: Callable[[], None], url: str, body: dict[str, Any],
    headers: dict[str, str], timeout: httpx.Timeout, into: Into, room: Room | None,
    complete: Callable[[], bool] | None, opened: Callable[[], None] | None,
) -> None:
    transport.watch(watch)
    try:
        await _pump(transport.client, url, body, headers, timeout, into, room, complete,
                    opened)
    finally:
        transport.unwatch(watch)


class _Held:
    """A stream's wait for `room`: its wake-up may come from any thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, room: Room) -> None:
        self._loop = loop
        self._ask = room
        self._room: asyncio.Future[None] | None = None

    def wake(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._set)
        except RuntimeError:  # the loop is closed: nothing waits any more
            pass

    def _set(self) -> None:
        if self._room is not None and not self._room.done():
            self._room.set_result(None)

    async def until_room(self) -> None:
        """Return once `room` says yes. The future is made only after it said no and
        before this coroutine yields, so the wake-up (a callback of this loop) finds it."""
        if self._ask(self.wake):
            return
        self._room = self._loop.create_future()
        try:
            await self._room
        finally:
            self._room = None


async def _pump(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str],
    timeout: httpx.Timeout, into: Into, room: Room | None = None,
    complete: Callable[[], bool] | None = None, opened: Callable[[], None] | None = None,
) -> None:
    held = None if room is None else _Held(asyncio.get_running_loop(), room)
    batch: list[Any] = []
    done = False  # `[DONE]` (or `complete`) came: what follows only keeps the connection
    try:
        request = client.build_request("POST", url, json=body, headers=headers,
                                       timeout=timeout)
        response = await _send(client, request)
        try:
            if response.status_code != 200:
                into.put(Status(response.status_code, response.headers.get("retry-after")))
                return
            if response.headers.get("content-encoding", "identity").lower() != "identity":
                into.put(Compressed())
                return
            if opened is not None:
                opened()
            lines = DataLines()
            reads = response.aiter_raw()
            async for data in reads:
                for payload in lines.feed(data):
                    if payload == _DONE:
                        done = True
                        break
                    batch.append(protocol.payload(payload))
                if batch:
                    into.put(batch)
                    batch = []
                    done = done or (complete is not None and complete())
                    if held is not None and not done:
                        await held.until_room()
                if done:
                    into.put(END)
                    await _finish(reads)
                    return
        finally:
            await response.aclose()  # to the pool if the body was read to its end
    except Exception as exc:  # the engine thread maps it to an error code
        if done:
            return  # the body's end did not come whole: only the connection is lost
        if batch:
            into.put(batch)
            batch = []
        into.put(exc)
    finally:
        if batch:
            into.put(batch)
        if not done:
            into.put(END)


async def _finish(reads: AsyncIterator[bytes]) -> None:
    """Read what is left of a body after `[DONE]` (its last chunk, normally in the same
    read or the next), for at most `DRAIN_SECONDS` and `DRAIN_BYTES`. A body read to its
    end lets its connection go back to the pool; past either bound (a `TimeoutError`,
    or a return) it is closed unread."""
    left = DRAIN_BYTES
    async with asyncio.timeout(DRAIN_SECONDS):
        async for data in reads:
            left -= len(data)
            if left < 0:
                return


async def _send(client: httpx.AsyncClient, request: httpx.Request) -> httpx.Response:
    """The answer's head, its body still to read. A request the upstream hung up on
    without answering is sent again at once, up to `RESENDS` times: an upstream closes
    a kept-alive connection after an answer (llama-server after every one, others when
    it has been idle a while), and the close may reach this side only after the pool
    has handed the connection out again, to as many requests as connections were let
    go at that moment. Each try that meets a closed connection drops it from the pool;
    the last try's failure is the request's."""
    for _ in range(RESENDS):
        try:
            return await _head(client, request)
        except _UNANSWERED:
            continue
    return await _head(client, request)


async def _head(client: httpx.AsyncClient, request: httpx.Request) -> httpx.Response:
    """One try of `_send`. A head h11 could not parse is `MalformedHead`: httpx reports
    it as the same `RemoteProtocolError` as a hang-up, and it was sent again as one,
    four times per attempt for an answer that comes back the same each time."""
    try:
        return await client.send(request, stream=True)
    except httpx.RemoteProtocolError as exc:
        if any(isinstance(cause, h11.RemoteProtocolError) for cause in error_chain(exc)):
            raise MalformedHead("the upstream's answer head cannot be parsed") from exc
        raise


class DataLines:
    """The `data:` payloads of an SSE body fed in arbitrary pieces, as bytes.

    Lines end in LF, CRLF or CR; a CRLF split between two pieces only makes an empty
    line, which carries nothing. Comments, event names and keep-alives are skipped
    without being decoded. A line still open beyond `MAX_LINE_BYTES` is a `ValueError`.
    A UTF-8 byte-order mark before the first line is dropped, as the SSE standard says.
    """

    def __init__(self) -> None:
        self._rest = b""
        self._first = True  # the body's first line, which may follow a byte-order mark

    def feed(self, data: bytes) -> list[bytes]:
        lines = (self._rest + data).splitlines(keepends=True)
        self._rest = lines.pop() if lines and not lines[-1].endswith(_LINE_ENDS) else b""
        if len(self._rest) > MAX_LINE_BYTES:
            raise ValueError(f"an SSE line longer than {MAX_LINE_BYTES} bytes")
        if self._first and lines:
            self._first = False
            lines[0] = lines[0].removeprefix(b"\xef\xbb\xbf")
        return [line[5:].strip() for line in lines if line.startswith(b"data:")]
