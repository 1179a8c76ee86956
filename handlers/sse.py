"""A task's event log as JSON pages and as Server-Sent Events (docs/events.md).

SSE framing is written here rather than with Litestar's `ServerSentEvent`: its ping
sends `: ping` plus a blank line, which some clients (OpenAI's SDK) parse as an empty
event and crash on. Our keep-alive is a bare comment line. A stream replays the stored
events after the resume point, then follows the live tail, and ends right after the
terminal event, so a client that reads to the end has seen the whole life of the task.
A page of the events a worker of this very process has just committed (its claim, start
and output, in `taskward run`) comes from the live tail's memory rather than the store
when the stream holds everything before them (`LiveTail.next_events`, `logged_page`);
only a terminal event, whose response object shows the final output, is read.

Each piece of a stream must be taken by its client in time, or the stream ends
(`handlers.slow_readers`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Annotated, Any

from litestar.datastructures.headers import MediaTypeHeader
from litestar.exceptions import ValidationException
from litestar.params import HeaderParameter, Parameter
from litestar.response import Stream

from core.errors import NotFound
from core.failure_streak import FailureTally
from core.objects import TERMINAL_EVENTS, Record, event_object
from core.states import TERMINAL, Status
from core.store.birth_event import birth_event
from core.store.database import Database, LoggedEvent
from core.store.tasks import task_and_events
from handlers.limits import end_with
from handlers.live import LiveTail
from handlers.slow_readers import ReadInTime
from handlers.threads import blocking, store_unavailable

log = logging.getLogger("taskward.http")
# An outage ends every open stream at once: one line for them, not one each.
_STREAMS_ENDED = FailureTally(
    log, "event streams end: store unavailable (%s); their clients resume from their last id",
    "store still unavailable (%s): %d more event streams ended")

KEEPALIVE_SECONDS = 15.0
AUTH_RECHECK_SECONDS = 1.0  # how soon an idle stream of a revoked client ends
KEEPALIVE = b": keepalive\n"
STREAM_PAGE = 100
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

# The largest resume point: the largest `seq` a log can hold (INTEGER on PostgreSQL).
# One more is refused here, as on SQLite, rather than by PostgreSQL's driver.
MAX_SEQ = 2**31 - 1
Seq = Annotated[int, Parameter(ge=0, le=MAX_SEQ)]
# Read as text: only a stream resumes from it (`resume_point`), so any other answer
# ignores it, whatever it holds.
LastEventId = Annotated[str | None, HeaderParameter(
    name="Last-Event-ID",
    description=f"the last event a reconnecting SSE client saw (0..{MAX_SEQ}); a stream "
                "resumes after it, other answers ignore it")]
EVENT_STREAM = "text/event-stream"


def asks_for_event_stream(accept: str) -> bool:
    """Whether an `Accept` header lists `text/event-stream` as acceptable: the type is
    compared without regard to case and `q=0` refuses it (RFC 9110, 12.5.1); a wildcard
    (`*/*`, `text/*`) does not ask for it, so JSON stays the default. Litestar parses
    each media range; its `Accept` ranking is not used, as it fails on a `q` such as
    `inf` and a choice between two answers needs no ranking."""
    ranges = (MediaTypeHeader(media_range) for media_range in accept.split(","))
    return any(f"{media.maintype}/{media.subtype}" == EVENT_STREAM
               and _acceptable(media.params.get("q")) for media in ranges)


def _acceptable(quality: str | None) -> bool:
    """A `q` of zero refuses a media range; an unreadable one is ignored, as if absent."""
    try:
        return quality is None or not float(quality) <= 0
    except ValueError:
        return True


def resume_point(after: int, last_event_id: str | None) -> int:
    """Where a stream starts: `Last-Event-ID` wins over the query, since a reconnecting
    client repeats its first URL but reports how far it has read since. A header that is
    not a `seq` (digits, at most `MAX_SEQ`) is a 422 `validation_error` naming it."""
    if last_event_id is None:
        return after
    seq = _as_seq(last_event_id)
    if seq is None:
        raise ValidationException(extra=[{
            "key": "last_event_id", "source": "header",
            "message": f"must be a whole number from 0 to {MAX_SEQ} in decimal digits"}])
    return seq


def _as_seq(text: str) -> int | None:
    """`text` as a `seq` when it is ASCII digits worth at most `MAX_SEQ`, else None; its
    length is checked before `int` reads it, which refuses very long digit strings."""
    digits = text.lstrip("0") or "0"
    if not (text.isascii() and text.isdigit() and len(digits) <= len(str(MAX_SEQ))):
        return None
    seq = int(digits)
    return seq if seq <= MAX_SEQ else None


@dataclass(frozen=True)
class EventsPage:
    events: list[dict[str, Any]]
    finished: bool  # the task is terminal: its log will not grow
    last_seq: int
    task: Record  # as read with the page (or created): what later lifecycle events show

    def next_after(self, after: int) -> int | None:
        """Where the next page starts; None once a finished task's log is exhausted."""
        seen = self.events[-1]["seq"] if self.events else after
        return None if self.finished and seen >= self.last_seq else seen


def read_events_page(
    db: Database, task_id: str, owner: str | None, after: int, limit: int
) -> EventsPage:
    """Events after `after` of a task `owner` may see (None: any), as public objects."""
    task, rows = task_and_events(db, task_id, owner, after=after, limit=limit)
    return EventsPage([event_object(task, task, row) for row in rows],
                      Status(task.status) in TERMINAL, task.last_seq, task)


def born_page(task: SimpleNamespace) -> EventsPage:
    """The first page of a task just created by this request: its birth event."""
    return EventsPage([event_object(task, None, birth_event(task))], False, 1, task)


def logged_page(events: Sequence[LoggedEvent], task: Record) -> EventsPage | None:
    """The page of `events` just committed by this process, built from their rows and
    `task` as the stream last read it (a lifecycle event before the end shows only what
    the task was created with: `event_object`); None (read the log) when there are none
    or one is terminal, whose response object shows the final output and usage, which
    the rows do not hold. Not `finished`: a terminal event ends the stream by itself."""
    if not events or any(event.type in TERMINAL_EVENTS for event in events):
        return None
    return EventsPage([event_object(task, None, event) for event in events], False,
                      events[-1].seq, task)


def frame(event: dict[str, Any]) -> bytes:
    """One SSE event; `json.dumps` escapes newlines, so `data` is always one line."""
    data = json.dumps(event["data"], separators=(",", ":"), ensure_ascii=False)
    return f"id: {event['seq']}\nevent: {event['type']}\ndata: {data}\n\n".encode()


StillAllowed = Callable[[], Awaitable[bool]]


async def event_stream(
    db: Database, tail: LiveTail, task_id: str, owner: str | None, after: int,
    still_allowed: StillAllowed, *, held: Callable[[], None],
    born: SimpleNamespace | None = None, headers: dict[str, str] | None = None,
) -> Stream:
    """`200 text/event-stream` of the events after `after`.

    The first page is read before answering, so an unknown task (or another client's)
    is a proper 404 problem rather than a stream that breaks at once; a stream of the
    request that has just created the task (`born`, the task as created) starts from
    its one birth event instead, without reading it back. Before a later
    page, once `AUTH_RECHECK_SECONDS` have passed since it was last asked, and every
    `AUTH_RECHECK_SECONDS` of an idle stream, `still_allowed()` is asked whether the
    caller's token still holds: a revoked client's streams end within about a second,
    and a stream of ten pages a second does not pay for ten checks. `held` ends the
    client's hold on a stream slot (`handlers.limits`): called once the stream is over,
    however it ends. `headers`: more of the answer's (a replay's `Idempotent-Replayed`).
    """
    try:
        first = (born_page(born) if born is not None else
                 await blocking(read_events_page, db, task_id, owner, after, STREAM_PAGE))
    except BaseException:
        held()
        raise
    follow = _follow(db, tail, task_id, owner, first, after, still_allowed, held)
    end_with(follow, held)
    return ReadInTime(follow, status_code=200, media_type="text/event-stream",
                      headers={**SSE_HEADERS, **(headers or {})})


async def _follow(
    db: Database, tail: LiveTail, task_id: str, owner: str | None, page: EventsPage, after: int,
    still_allowed: StillAllowed, held: Callable[[], None],
) -> AsyncGenerator[bytes, None]:
    try:
        async for chunk in _frames(db, tail, task_id, owner, page, after, still_allowed):
            yield chunk
    except Exception as exc:
        if not store_unavailable(exc):
            raise
        # Its status was sent long ago: the stream ends whole, and the client resumes
        # from the last `id` it read once the store answers (docs/events.md).
        _STREAMS_ENDED.failed(exc)
    finally:
        held()


async def _frames(
    db: Database, tail: LiveTail, task_id: str, owner: str | None, page: EventsPage, after: int,
    still_allowed: StillAllowed,
) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    checked_at = loop.time()  # the caller was authenticated just before the first page
    sent_at = loop.time()  # of the last byte sent, from which a keep-alive falls due
    while True:
        for event in page.events:
            yield frame(event)
            sent_at = loop.time()
            if event["type"] in TERMINAL_EVENTS:
                return
        next_after = page.next_after(after)
        if next_after is None:
            return
        after = next_after
        heard: Sequence[LoggedEvent] = ()
        if len(page.events) < STREAM_PAGE:
            # A resume point past the log's end waits for the log's next event, and reads
            # the log after it: waiting for one past that point outlived the task's end
            # (keep-alives for ever, its slot held).
            ahead = after > page.last_seq
            async for item in _quiet_until_more(tail, task_id, min(after, page.last_seq),
                                                 still_allowed, sent_at):
                if item is None:
                    return
                if isinstance(item, bytes):
                    yield item
                    sent_at = loop.time()
                elif not ahead:
                    heard = item
        if loop.time() - checked_at >= AUTH_RECHECK_SECONDS:
            if not await still_allowed():
                return
            checked_at = loop.time()
        from_memory = logged_page(heard, page.task)
        if from_memory is not None:
            page = from_memory
            continue
        try:
            page = await blocking(read_events_page, db, task_id, owner, after, STREAM_PAGE)
        except NotFound:  # removed while we followed it (retention, DELETE)
            return


async def _quiet_until_more(
    tail: LiveTail, task_id: str, after: int, still_allowed: StillAllowed, sent_at: float
) -> AsyncIterator[bytes | Sequence[LoggedEvent] | None]:
    """While the log holds nothing after `after`: a keep-alive once `KEEPALIVE_SECONDS`
    have passed since the stream last sent a byte (`sent_at`, on the event loop's clock),
    the caller's token checked every `AUTH_RECHECK_SECONDS` (None once it is revoked,
    or once the server is stopping: `LiveTail.close_waits`); last, what woke it
    (`LiveTail.next_events`: the events, or `()` to read the log). The count is not
    restarted by a wake-up: a stream resumed past the end of a live log is woken by
    every event it does not send, and would otherwise stay silent for as long as the
    task writes (a proxy's idle timeout cuts it)."""
    loop = asyncio.get_running_loop()
    while True:
        if tail.closing:
            yield None
            return
        if loop.time() - sent_at >= KEEPALIVE_SECONDS:
            sent_at = loop.time()
            yield KEEPALIVE
        until_keepalive = sent_at + KEEPALIVE_SECONDS - loop.time()
        heard = await tail.next_events(task_id, after,
                                       min(AUTH_RECHECK_SECONDS, until_keepalive))
        if heard is not None:
            yield heard
            return
        if not await still_allowed():
            yield None
            return
