"""The `openai` engine: an attempt streamed from an upstream, failing over between URLs.

An attempt goes to the base URL `routing` picks. A connection that is refused, reset or
times out cools that URL down and the attempt continues at once on another one; so does
a 502, 503 or 504 (a server loading its model, or a gateway before one that is down: for
its `Retry-After` if it gives one). Another retryable status (500, 408, 429) or a stream
that breaks moves the attempt on too, but cools nothing down. Whatever was streamed
before stays: the next URL is asked to continue it, exactly as a resumed task is, so
output is never repeated or lost. When no URL is left the last error ends the attempt
(retryable ones are backed off by the worker, `Retry-After` or the cool-down as the
floor). An attempt that found every URL cooling down before sending anything ends with
`NoUrlNow`, which spends no attempt (the worker hands the task back).

The snapshot is `{"v", "text", "output_tokens", "input_tokens"}`: the text generated so
far (all attempts of the task), the tokens it took, and the original prompt's size.

Each network read becomes its chunk on the transport's loop thread (`_Relay`), which
hands it straight to the attempt's inbox (`emit`): the engine thread is not woken per
read only to parse and forward, it waits for what ends the request (the end, a
status, an error, a stop) and decides what follows (fail over, or finish). A stop is
seen by the relay after a read, or while the upstream is silent by the transport's
one watch timer (`transport.WATCH_SECONDS`), so the engine thread sleeps through a
request that waits in the upstream's queue instead of waking to look. The same timer
ends, as timed out, a stream that keeps sending without tokens (`_Read.stalled`).

An upstream may send faster than the attempt's runner can store (a broken or hostile
one, at megabytes a second). Two things keep that from taking the process's memory and
its other attempts' time. A read costs what it brought, not what came before it: the
text so far is kept in pieces and a chunk's snapshot holds a view of them
(`_TextSoFar`), made into one string only when a flush writes it. And after each read
the stream asks the inbox whether it holds too much (`HoldsBack.room`): while it does,
the stream reads nothing more, the socket's buffers fill and TCP slows the upstream
down (`transport.open_stream`'s `room`).
"""

from __future__ import annotations

import os
import queue
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx

from core.engines.base import (
    Chunk,
    Emit,
    EngineError,
    EngineOptions,
    GenerationRequest,
    HoldsBack,
    ModelSource,
    Snapshot,
    UpstreamModel,
    Usage,
)
from core.engines.upstream import protocol, transport
from core.engines.upstream.hosts import UrlRefused, check_allowed
from core.engines.upstream.key_envs import KeyEnvRefused, check_key_env
from core.engines.upstream.network import TlsHandshakeTimedOut
from core.engines.upstream.routing import ROUTER, NoUrlNow, Router
from core.error_chain import error_chain

NAME = "openai"
SNAPSHOT_VERSION = 1
# How often the engine thread looks at `should_stop` itself: only in case the transport's
# loop cannot (it is stuck); the relay and the loop's watch see a stop far sooner.
_SAFETY_POLL_SECONDS = 1.0
_CONNECT_SECONDS = 10.0
# How long a finished answer's stream is waited for when neither its usage nor `[DONE]`
# ends it (`_Read.lingers`): a server sends both at once after its finish, and one
# that keeps the connection open instead held a complete answer for its whole timeout.
_TAIL_SECONDS = 1.0


class OpenAIEngine:
    name = NAME

    def __init__(self, options: EngineOptions, router: Router = ROUTER) -> None:
        self._options = options
        self._router = router

    def load(self, model: ModelSource) -> UpstreamLoaded:
        """Nothing to load: the upstream holds the weights. A file entry cannot be served."""
        if not isinstance(model, UpstreamModel):
            raise EngineError("engine_mismatch", "the openai engine serves upstream entries only",
                              retryable=False)
        return UpstreamLoaded(model, self._options, self._router)


class _TextSoFar:
    """The text of an attempt up to one chunk, as the pieces it came in (a tuple: what a
    view holds never changes). Made into one string only when asked (`str`): when a
    flush writes its snapshot (scheduler/output.py writes a snapshot value JSON has no
    form for as its `str`), once per flush. A copy of all the text at every read made
    the cost of a stream quadratic in its length, and every chunk waiting for the
    runner held a copy of its own: gigabytes for an upstream sending 1.3 MB/s."""

    __slots__ = ("pieces",)

    def __init__(self, pieces: tuple[str, ...]) -> None:
        self.pieces = pieces

    def __str__(self) -> str:
        return "".join(self.pieces)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (str, _TextSoFar)):
            return str(self) == str(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # compared by value, as a str would be


def _appended(pieces: tuple[str, ...], text: str) -> tuple[str, ...]:
    """`pieces` and then `text`, the last pieces joined while one is not at least twice
    as long as the one after it: at most about log2 of the text's length pieces, and
    each character copied about as often, however small the reads."""
    while pieces and len(pieces[-1]) < 2 * len(text):
        text = pieces[-1] + text
        pieces = pieces[:-1]
    return (*pieces, text)


@dataclass
class _Progress:
    """The attempt's output so far, carried across URLs and into snapshots."""

    pieces: tuple[str, ...]
    output_tokens: int
    input_tokens: int

    @classmethod
    def of(cls, snapshot: Snapshot | None) -> _Progress:
        if snapshot is None:
            return cls((), 0, 0)
        text, out, inp = (snapshot.get("text"), snapshot.get("output_tokens"),
                          snapshot.get("input_tokens"))
        if (snapshot.get("v") != SNAPSHOT_VERSION or not isinstance(text, str)
                or not isinstance(out, int) or not isinstance(inp, int)):
            raise EngineError("invalid_snapshot", "snapshot was not written by this engine",
                              retryable=False)
        return cls((text,) if text else (), out, inp)

    @property
    def text(self) -> str:
        """All of it as one string: once per request (its continuation's prefix)."""
        return "".join(self.pieces)

    def add(self, text: str) -> None:
        if text:
            self.pieces = _appended(self.pieces, text)

    def count(self, output_tokens: int) -> None:
        """The output count, never beyond what the store's columns hold: counted on past
        a reported 2^31 - 1 (one more per delta), it made every write of the attempt
        fail on PostgreSQL, which then waited out its lease."""
        self.output_tokens = min(output_tokens, protocol.MAX_TOKENS)

    def chunk(self, text: str) -> Chunk:
        return Chunk(text, {"v": SNAPSHOT_VERSION, "text": _TextSoFar(self.pieces),
                            "output_tokens": self.output_tokens,
                            "input_tokens": self.input_tokens},
                     Usage(self.input_tokens, self.output_tokens))


class _Read:
    """One request's output as its reads arrive: text past the echo, token counts, and
    whether the server said it finished.

    Nothing but the server itself ends its text, so a broken one could have the task
    store without end: text past the task's `max_output_tokens` (asked for as
    `max_tokens`; a text delta holds at least one token, so text arriving once the
    limit's count is reached is past it) cuts the read there, as finished, without that
    text (`cut`: the relay closes it). Text after the server's own `finish_reason` is
    not the answer's either, and is dropped; the read goes on for the usage that
    follows the finish (cut there, the task showed no prompt tokens).

    A finished answer is complete whatever its stream does next: the usage after the
    finish is all that is still read (`settled` once it came), and a stream that
    neither reports it nor ends soon after is not waited for (`lingers`). An answer
    not finished has its server generating: a stream that brings no tokens for the
    entry's timeout (`stalled`) is as silent as one that brings no bytes, however many
    empty events or keep-alives it sends.

    The prompt's size (`input_tokens`) is the original prompt's as its server reported
    it. A continuation's server counts the text it continues as prompt: that is output
    (counted as such already), so the continuation's prompt count stands for the
    original prompt's, less the text so far, only when none was reported before it."""

    def __init__(self, progress: _Progress, url: str, limit: int | None,
                 quiet_seconds: float) -> None:
        self.progress = progress
        self.url = url
        self.limit = limit
        self.quiet_seconds = quiet_seconds
        self.echo = protocol.EchoStrip(progress.text)
        self.earlier_tokens = progress.output_tokens
        self.counts_prompt = not (progress.input_tokens and self.earlier_tokens)
        self.finished = False
        self.finished_at = 0.0  # time.monotonic() when the finish came
        # When the server last generated, or began to answer; None until it did.
        self.heard_at: float | None = None
        self.settled = False  # finished, and a usage came with the finish or after it
        self.cut = False

    def absorb(self, payloads: list[Any]) -> tuple[Chunk | None, EngineError | None]:
        """One read's payloads: the chunk they make (None: nothing to tell), and the
        error of an in-stream error object or a malformed payload, which ends the read
        after what came before it."""
        progress = self.progress
        text, counted, error = "", False, None
        for payload in payloads:
            try:
                piece = protocol.parse_chunk(payload, self.url)
            except EngineError as exc:
                error = exc
                break
            if piece.generated:
                self.heard()
            delta = "" if self.finished else piece.text
            if delta and self.limit is not None and progress.output_tokens >= self.limit:
                text += self.echo.flush()
                self._finish()
                self.cut = True
                break
            if piece.prompt_tokens is not None and self.counts_prompt:
                progress.input_tokens = max(0, piece.prompt_tokens - self.earlier_tokens)
                counted = True
            if piece.completion_tokens is not None:
                # Never below the deltas seen: a server reporting 0 in every chunk
                # would otherwise stream past `max_output_tokens` unchecked.
                progress.count(max(progress.output_tokens + bool(delta),
                                   self.earlier_tokens + piece.completion_tokens))
                counted = True
            elif delta:
                progress.count(progress.output_tokens + 1)  # one token per delta, mostly
            text += self.echo.push(delta)
            if piece.finished:
                text += self.echo.flush()
                self._finish()
            if self.finished and piece.reported:
                self.settled = True
        progress.add(text)
        return (progress.chunk(text) if text or counted else None), error

    def _finish(self) -> None:
        if not self.finished:
            self.finished, self.finished_at = True, time.monotonic()

    def heard(self) -> None:
        """The server is generating (or began to answer, or, after the stream was held
        back, may generate again)."""
        self.heard_at = time.monotonic()

    def lingers(self) -> bool:
        """Whether the answer finished over `_TAIL_SECONDS` ago and its stream is still
        open: what it might still send is at most a usage, not worth the wait."""
        return self.finished and time.monotonic() - self.finished_at > _TAIL_SECONDS

    def stalled(self) -> bool:
        """Whether the answer is not finished and no tokens came for `quiet_seconds`
        (since the answer's head, the first time): what the client's read timeout says
        of a silent stream, said of one that sends only events without tokens. Before
        the head, the client's own timeouts bound the connection and the wait."""
        return (not self.finished and self.heard_at is not None
                and time.monotonic() - self.heard_at > self.quiet_seconds)


class _Stalled(httpx.ReadTimeout):
    """A stream that sent no tokens for the entry's timeout (`_Read.stalled`): a read
    timeout, told apart in its message because bytes did come."""


# The relay ended the request: `should_stop` was true (after a read, or watching), or
# the read was cut (`_Read.cut`, then also finished).
_STOPPED = object()


class _Relay:
    """The transport loop's side of one request (its `Into`): each read's chunk made on
    that thread and handed to `emit`, or without one to the engine thread through
    `control`, which also gets whatever ends the request. Under a lock, so once `close`
    returns nothing more is handed on and `read` is the engine thread's again. `room`
    is the transport's question after each read (`core.engines.base.Room`): the answer of an
    `emit` that can hold back, else always yes; so is `complete` (the answer finished and
    its usage came: the stream ends there, as at `[DONE]`), and `opened` (a 200 head
    came: the stall watch starts, `_Read.stalled`). The first thing the server
    sends (a read, a status, the end) is `answered`: a probe of a URL out of cool-down
    has succeeded, and the router lets other attempts use the URL at once, not after
    this one ends."""

    def __init__(
        self, read: _Read, emit: Emit | None, control: queue.SimpleQueue[Any],
        should_stop: Callable[[], bool], answered: Callable[[], None],
    ) -> None:
        self._answered: Callable[[], None] | None = answered
        self._read = read
        self._emit = emit or control.put
        self._holds = emit if isinstance(emit, HoldsBack) else None
        self._control = control
        self._should_stop = should_stop
        self._lock = threading.Lock()
        self._closed = False
        self._held = False  # `room` said no, and no read came since

    def room(self, wake: Callable[[], None]) -> bool:
        """While it says no, the stream reads nothing: time that is this side's, not the
        server's silence, so the stall watch pauses (`_held`) until the next read."""
        if self._holds is None or self._closed or self._holds.room(wake):
            return True
        self._held = True
        return False

    def complete(self) -> bool:
        return self._read.settled

    def opened(self) -> None:
        with self._lock:
            self._read.heard()

    def put(self, item: Any) -> None:
        with self._lock:
            if self._answered is not None:  # the first item only: END follows a failure
                if _server_up(item):
                    self._answered()
                self._answered = None
            if self._closed:
                return
            if not isinstance(item, list):  # END, a status, a transport failure
                self._control.put(item)
                return
            if self._held:  # reading again: the server's time counts from here
                self._held = False
                self._read.heard()
            chunk, error = self._read.absorb(item)
            if chunk is not None:
                self._emit(chunk)
            if error is not None or self._read.cut or self._should_stop():
                self._end(_STOPPED if error is None else error)

    def watch(self) -> None:
        """The transport's timer, between reads: a stop asked for while the upstream
        sends nothing ends the request too, and so does a finished answer's stream that
        lingers (`_Read.lingers`). One that stalled (`_Read.stalled`) ends as timed out,
        unless this side holds it back."""
        with self._lock:
            if self._closed:
                return
            if self._should_stop() or self._read.lingers():
                self._end(_STOPPED)
            elif not self._held and self._read.stalled():
                self._end(_Stalled(f"no tokens for {self._read.quiet_seconds:g} s"))

    def _end(self, why: Any) -> None:
        """Under the lock: nothing more is handed on, and the engine thread hears why."""
        self._closed = True
        self._control.put(why)

    def close(self) -> None:
        with self._lock:
            self._closed = True


def _server_up(first: Any) -> bool:
    """Whether a request's first item shows its server up, answering a probe: not a
    transport failure, nor a status saying the server is not ready (a probe's 503
    "Loading model" taken as an answer released every waiting task to the URL, each to
    spend an attempt on the same 503)."""
    if isinstance(first, transport.Status):
        return not protocol.not_ready(first.code)
    return not isinstance(first, BaseException)


class _Failover(Exception):
    """A retryable failure on one URL: try the next one with what was streamed so far."""

    def __init__(self, error: EngineError) -> None:
        super().__init__(error.message)
        self.error = error


class UpstreamLoaded:
    def __init__(self, entry: UpstreamModel, options: EngineOptions, router: Router) -> None:
        self._entry = entry
        self._options = options
        self._router = router

    def generate(
        self, request: GenerationRequest, snapshot: Snapshot | None,
        should_stop: Callable[[], bool], emit: Emit | None = None,
    ) -> Iterator[Chunk]:
        progress = _Progress.of(snapshot)
        headers = self._headers()
        tried: set[str] = set()
        last: EngineError | None = None
        while not should_stop():
            url = self._router.pick(self._entry.model_id, self._entry.base_urls, tried)
            if url is None:
                raise self._cooled(last) if last else self._no_url_now()
            tried.add(url)
            try:
                with self._router.using(url):
                    yield from self._stream(url, headers, request, progress, should_stop,
                                            emit)
                return
            except _Failover as failover:
                last = failover.error

    def _headers(self) -> dict[str, str]:
        """The key's header, or a non-retryable `upstream_key_missing`: an entry stored
        before `key_envs`' rule (or the setting) may name a variable never to be sent, and
        a value no header can carry (`_sendable`) would fail every attempt the same way."""
        name = self._entry.api_key_env
        if not name:
            return {}
        try:
            check_key_env(name, self._options.upstream_key_envs)
        except KeyEnvRefused as exc:
            raise EngineError(protocol.KEY_MISSING, exc.message, retryable=False) from None
        key = os.environ.get(name)
        if not key:
            raise EngineError(protocol.KEY_MISSING,
                              f"environment variable {name} (api_key_env) is not set",
                              retryable=False)
        if not _sendable(key):
            raise EngineError(protocol.KEY_MISSING,
                              f"environment variable {name} (api_key_env) holds no key a "
                              "header can carry (printable ASCII, no space at either end)",
                              retryable=False)
        return {"Authorization": f"Bearer {key}"}

    def _cooled(self, last: EngineError) -> EngineError:
        """The last URL's failure, backed off at least until a URL leaves its cool-down:
        a retry sooner (the worker's backoff is 1-2 s, a cool-down 10) found every URL
        cooling and spent an attempt without a request."""
        wait = self._router.cooldown_left_seconds(self._entry.base_urls)
        last.retry_after_seconds = max(last.retry_after_seconds or 0, wait) or None
        return last

    def _no_url_now(self) -> NoUrlNow:
        """Come back when the first URL leaves its cool-down; while another attempt
        probes the last one, a cool-down from now (when a failed probe's ends)."""
        urls = self._entry.base_urls
        wait = (self._router.cooldown_left_seconds(urls)
                or self._options.upstream_cooldown_seconds)
        return NoUrlNow(urls, wait)

    def _stream(
        self, url: str, headers: dict[str, str], request: GenerationRequest,
        progress: _Progress, should_stop: Callable[[], bool], emit: Emit | None,
    ) -> Iterator[Chunk]:
        """One request to `url`, its deltas as chunks (to `emit` if given); `_Failover`
        when the next URL should take over, `EngineError` when no URL would do better."""
        try:
            check_allowed(url, self._options.upstream_allowed_hosts)
        except UrlRefused as exc:
            raise EngineError(exc.code, exc.message, retryable=False) from None
        limit = request.max_output_tokens
        left = None if limit is None else limit - progress.output_tokens
        if left is not None and left <= 0:
            return
        body = protocol.chat_body(self._entry.model, request, prefix=progress.text,
                                  max_tokens=left)
        read = _Read(progress, url, limit, self._entry.timeout_seconds)
        yield from self._request(url, body, headers, read, should_stop, emit)
        if should_stop():
            return
        if not read.finished:
            held = read.echo.flush()
            if held:  # yielded: every chunk the relay handed on came before
                progress.add(held)
                yield progress.chunk(held)
            self._router.failed(self._entry.model_id, url, protocol.STREAM_BROKEN,
                                cooldown_seconds=0)
            raise _Failover(protocol.stream_broken(url))

    def _request(
        self, url: str, body: dict[str, Any], headers: dict[str, str], read: _Read,
        should_stop: Callable[[], bool], emit: Emit | None,
    ) -> Iterator[Chunk]:
        """One request's chunks, one per network read (a wake-up and a snapshot per
        read, not per token), made by its `_Relay` and handed to `emit`, or yielded
        here without one; until the stream ends or `should_stop`. Leaving early (either
        way) closes the connection at once; after the end it goes back to the pool. What
        a read brought before an error comes before the error."""
        control: queue.SimpleQueue[Any] = queue.SimpleQueue()
        relay = _Relay(read, emit, control, should_stop, partial(self._router.answered, url))
        seconds = self._entry.timeout_seconds
        timeout = httpx.Timeout(seconds, connect=min(seconds, _CONNECT_SECONDS))
        stream = transport.open_stream(f"{url}/chat/completions", body, headers, timeout, relay,
                                       max_connections=self._options.upstream_concurrency,
                                       watch=relay.watch, room=relay.room,
                                       complete=relay.complete, opened=relay.opened)
        ended = False  # the stream's END: the transport finishes its connection itself
        try:
            while True:
                try:
                    item = control.get(timeout=_SAFETY_POLL_SECONDS)
                except queue.Empty:
                    if should_stop():
                        return
                    continue
                if item is transport.END:
                    ended = True
                    return
                if item is _STOPPED:
                    return
                if isinstance(item, Chunk):
                    yield item
                elif read.finished:
                    return  # a failure after the finish takes nothing from the answer
                elif isinstance(item, transport.Status):
                    self._status(url, item)
                elif isinstance(item, transport.Compressed):
                    self._refused(url, protocol.compressed(url))
                elif isinstance(item, EngineError):
                    self._refused(url, item)
                else:
                    self._broken(url, item)
        finally:
            relay.close()
            if not ended:
                stream.cancel()

    def _status(self, url: str, status: transport.Status) -> None:
        """A status other than 200. One saying the server is not ready cools the URL
        down for its `Retry-After` (when positive: a date already past is a clock
        apart, not a promise), else as a refused connection does; the attempt goes on
        to the next URL either way."""
        error = protocol.status_error(url, status.code, status.retry_after)
        if protocol.not_ready(status.code):
            cooldown = error.retry_after_seconds or self._options.upstream_cooldown_seconds
            self._router.failed(self._entry.model_id, url, error.code,
                                cooldown_seconds=cooldown)
            raise _Failover(error)
        self._refused(url, error)

    def _refused(self, url: str, error: EngineError) -> None:
        self._router.failed(self._entry.model_id, url, error.code, cooldown_seconds=0)
        raise _Failover(error) if error.retryable else error

    def _broken(self, url: str, error: BaseException) -> None:
        """A transport failure: refused, reset or timed out cools the URL down."""
        if isinstance(error, httpx.TransportError):
            what = _describe(error)
            self._router.failed(self._entry.model_id, url, protocol.UNAVAILABLE,
                                cooldown_seconds=self._options.upstream_cooldown_seconds)
            raise _Failover(protocol.unavailable(url, what))
        self._router.failed(self._entry.model_id, url, protocol.STREAM_BROKEN,
                            cooldown_seconds=0)
        raise _Failover(protocol.stream_broken(url))


def _sendable(key: str) -> bool:
    """Whether `key` can follow `Bearer ` in a header. A line break or another control
    character, a character beyond ASCII or a space at either end made the client refuse
    the request as a broken connection (the URL cooled down, the model's other tasks
    with it) or a broken stream, retried until dead-lettered."""
    return key.isascii() and key.isprintable() and key == key.strip()


def _describe(error: httpx.TransportError) -> str:
    """What failed, for the message. A connection that failed in its TLS handshake is
    told apart from a server that is down, so the operator sees a certificate this
    process does not trust (a private CA: `SSL_CERT_FILE`, docs/upstream.md) or an
    `https://` URL of a plain-HTTP server; the SSL error's own text is not repeated."""
    if isinstance(error, httpx.ConnectError):
        chain = list(error_chain(error))
        if any(isinstance(cause, ssl.SSLCertVerificationError) for cause in chain):
            return "TLS certificate not trusted (SSL_CERT_FILE names the CAs to trust)"
        if any(isinstance(cause, ssl.SSLError) for cause in chain):
            return "TLS handshake failed"
        return "connection failed"
    if isinstance(error, _Stalled):
        return str(error)
    if isinstance(error, httpx.TimeoutException):
        if any(isinstance(cause, TlsHandshakeTimedOut) for cause in error_chain(error)):
            return "TLS handshake timed out"
        return "timed out"
    return "connection broken"

