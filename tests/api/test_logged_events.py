"""Streams handed the events a worker of their own process has just committed
(`taskward run`): sent from the live tail's memory when they continue the stream
exactly, read from the log otherwise, never when their write failed."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

import pytest

from core.engines.base import Usage
from core.errors import LeaseLost
from core.objects import event_object
from core.store import claims, completion, worker_writes
from core.store.connect import create_db_engine
from core.store.database import EVENTS_CHANNEL, Database, Logged, LoggedEvent, logged
from core.store.tasks import read_events
from handlers import sse
from handlers.live import LiveTail
from tests.api.helpers import Caller, closing_events, complete_soon, output_events, start_due
from tests.api.test_events import create, finished_task, parse_sse


def stored(db: Database, task_id: str, after: int = 0) -> list[LoggedEvent]:
    with db.read() as conn:
        return [LoggedEvent(row.seq, row.type, row.created_at, row.data)
                for row in read_events(conn, task_id, after=after)]


def write_output(db: Database, claim: claims.Claim, text: str) -> None:
    worker_writes.append_output(db, claim.task_id, claim.owner_token,
                                output_events(claim.task_id, text)[2:], text=text)


async def with_tail(db: Database, work: Any) -> Any:
    """`work(tail)` with a tail whose polls come every 10 s: only commits wake it."""
    tail = LiveTail(db, interval_seconds=10)
    await tail.start()
    try:
        return await work(tail)
    finally:
        await tail.stop()


read_page = sse.read_events_page  # as the tests' own reads call it, never counted


def counted_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Where each page a stream reads from the log starts, from now on."""
    reads: list[int] = []

    def counted(*args: Any) -> sse.EventsPage:
        reads.append(args[3])
        return read_page(*args)

    monkeypatch.setattr(sse, "read_events_page", counted)
    return reads


def streamed_while(db: Database, task_id: str, worker: Callable[[], None]) -> bytes:
    """The whole SSE body of `task_id` from its start, streamed while `worker` writes
    on a thread of its own, as a sweeper of this process would."""
    async def follow(tail: LiveTail) -> bytes:
        async def allowed() -> bool:
            return True

        answer = await sse.event_stream(db, tail, task_id, None, 0, allowed, held=lambda: None)
        writing = asyncio.ensure_future(asyncio.to_thread(worker))
        frames = answer.iterator
        assert isinstance(frames, AsyncIterator)
        body = b"".join([chunk.encode() if isinstance(chunk, str) else chunk
                         async for chunk in frames])
        await writing
        return body

    body: bytes = asyncio.run(with_tail(db, follow))
    return body


def whole_log(db: Database, task_id: str) -> bytes:
    """What a stream reading the whole log sends."""
    events = read_page(db, task_id, None, 0, 100).events
    return b"".join(sse.frame(event) for event in events)


def pause() -> None:
    threading.Event().wait(0.2)  # the stream is waiting again by now


def test_a_stream_sends_output_committed_here_without_reading_the_log(
    alice: Caller, model_id: str, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three output writes reach the stream from memory; only its first page and the
    completion (whose events embed the response object) are read. What it sends is
    byte for byte what a stream reading the whole log sends."""
    task_id = create(alice, model_id)
    [claim] = start_due(db)
    reads = counted_reads(monkeypatch)

    def worker() -> None:
        for text in ("w0 ", "w1 ", "w2 "):
            pause()
            write_output(db, claim, text)
        pause()
        completion.complete(db, task_id, claim.owner_token,
                            closing_events(task_id, "w0 w1 w2 "), usage=Usage(3, 3))

    body = streamed_while(db, task_id, worker)
    assert body == whole_log(db, task_id)
    assert len(reads) == 2  # the first page, the completion's; none for the 3 outputs


@pytest.mark.parametrize("upstream_limit", [0, 1])
def test_the_claim_and_the_start_reach_the_stream_from_memory(
    alice: Caller, model_id: str, db: Database, monkeypatch: pytest.MonkeyPatch,
    upstream_limit: int,
) -> None:
    """A stream that began before the claim is sent each claim's `response.loading`,
    each start's `response.in_progress` (riding with the first output) and a retry's
    `response.queued` without reading the log: their response objects show what the
    task was created with. On PostgreSQL a claim is one statement that commits by
    itself, or, with upstream slots to fill, a transaction; both name their rows. The
    stream reads its first page and the completion only, and sends byte for byte what a
    stream reading the log sends."""
    task_id = create(alice, model_id)
    reads = counted_reads(monkeypatch)

    def worker() -> None:
        for attempt in (1, 2):
            pause()
            [claim] = claims.claim(db, limit=1, upstream_limit=upstream_limit,
                                   lease_ms=60_000, node_id="test-worker")
            pause()
            worker_writes.append_output(db, task_id, claim.owner_token,
                                        output_events(task_id, "w0 "), text="w0 ", start=True)
            if attempt == 1:
                pause()
                worker_writes.requeue(db, task_id, claim.owner_token, delay_ms=0,
                                      code="engine_error", message="the engine stopped")
        pause()
        completion.complete(db, task_id, claim.owner_token, closing_events(task_id, "w0 "),
                            usage=Usage(3, 1))

    body = streamed_while(db, task_id, worker)
    assert body == whole_log(db, task_id)
    for event_type in ("loading", "in_progress", "queued"):
        assert body.count(f"event: response.{event_type}\n".encode()) == 2 - (
            event_type == "queued")
    assert len(reads) == 2  # the first page, the completion's


def test_a_claim_names_the_events_it_logged_as_stored(
    alice: Caller, model_id: str, db: Database
) -> None:
    """What a claim tells this process of each task it took is that task's last row
    as the log stores it: `response.loading` for a new attempt, `response.in_progress`
    for a resumed one."""
    resumable = alice.post("/v1/responses", json={"model": model_id, "input": "words=3",
                                                  "on_restart": "resume"}).json()["id"]
    [first] = claims.claim(db, limit=1, lease_ms=1, node_id="test-worker")
    worker_writes.start_running(db, resumable, first.owner_token)
    fresh = create(alice, model_id)
    threading.Event().wait(0.01)  # the resumable task's lease has run out
    heard: list[Logged] = []
    stop = db.listen(EVENTS_CHANNEL, heard.append)
    try:
        taken = claims.claim(db, limit=5, lease_ms=60_000, node_id="test-worker")
    finally:
        stop()
    assert {claim.task_id for claim in taken} == {resumable, fresh}
    assert {news.task_id: list(news.events) for news in heard} == {
        task_id: stored(db, task_id)[-1:] for task_id in (resumable, fresh)}
    assert {news.events[0].type for news in heard} == {
        "response.loading", "response.in_progress"}


def test_a_stream_of_the_creating_request_starts_without_reading_the_task_back(
    alice: Caller, model_id: str, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`POST /v1/responses` with `stream: true` sends the task's birth event from the
    task as it created it: the log is read only for what follows (a worker of another
    process writes here, so the stream reads the rest), and the stream sends byte for
    byte what a reader of the log gets."""
    reads = counted_reads(monkeypatch)
    worker = complete_soon(db)
    answer = alice.post("/v1/responses", json={"model": model_id, "input": "words=3",
                                               "background": False, "stream": True})
    worker.join()
    task_id = json.loads(parse_sse(answer.text)[0]["data"])["response"]["id"]
    assert answer.content == whole_log(db, task_id)
    assert reads and 0 not in reads


def test_a_terminal_event_is_read_with_its_response(
    alice: Caller, model_id: str, db: Database
) -> None:
    """A terminal event's response object shows the final output and usage, which its
    row does not hold: a stream handed one reads the log, and rendering one without the
    response is refused rather than shown empty."""
    task_id = finished_task(alice, model_id, db)
    completed = stored(db, task_id)[-1]
    task = read_page(db, task_id, None, 0, 100).task
    assert completed.type == "response.completed"
    assert sse.logged_page([completed], task) is None
    with pytest.raises(ValueError, match="as stored"):
        event_object(task, None, completed)


def test_nothing_is_named_while_nobody_listens(db: Database) -> None:
    """A sweeper on its own (no live tail) pays nothing for naming rows: they are not
    even read."""
    def never_read() -> Iterator[dict[str, Any]]:
        raise AssertionError("rows read with nobody listening")
        yield {}

    db.announce_committed_events(["task"], never_read())
    with db.write_events() as conn:
        logged(conn, never_read())


def test_events_that_continue_the_waiter_are_handed_over_as_stored(
    alice: Caller, model_id: str, db: Database
) -> None:
    task_id = create(alice, model_id)
    [claim] = start_due(db)
    seen = stored(db, task_id)[-1].seq

    async def wait_for_output(tail: LiveTail) -> Sequence[LoggedEvent] | None:
        waiting = asyncio.ensure_future(tail.next_events(task_id, seen, 2))
        await asyncio.sleep(0.05)
        await asyncio.to_thread(worker_writes.append_output, db, task_id, claim.owner_token,
                                output_events(task_id, "w0 "), text="w0 ")
        return await waiting

    handed = asyncio.run(with_tail(db, wait_for_output))
    assert list(handed or ()) == stored(db, task_id, after=seen)
    assert [event.type for event in handed or ()] == [
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta"]


def test_a_waiter_that_joined_mid_batch_reads_the_log(
    alice: Caller, model_id: str, db: Database
) -> None:
    """A waiter that has seen part of what a commit logged (it read the log while the
    commit was heard) is told to read: handing it the batch would repeat events."""
    task_id = create(alice, model_id)
    [claim] = start_due(db)
    seen = stored(db, task_id)[-1].seq

    async def wait_inside_the_batch(tail: LiveTail) -> list[Sequence[LoggedEvent] | None]:
        waiting = [asyncio.ensure_future(tail.next_events(task_id, after, 2))
                   for after in (seen, seen + 1, seen + 2)]
        await asyncio.sleep(0.05)
        await asyncio.to_thread(worker_writes.append_output, db, task_id, claim.owner_token,
                                output_events(task_id, "w0 "), text="w0 ")
        return list(await asyncio.gather(*waiting))

    whole, mid, last = asyncio.run(with_tail(db, wait_inside_the_batch))
    assert len(whole or ()) == 3
    assert mid == () and last == ()


def test_a_write_that_fails_is_never_handed_out(
    alice: Caller, model_id: str, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fenced write (a stale owner) and one rolled back after its events were logged
    in the transaction wake nobody; the log holds neither."""
    task_id = create(alice, model_id)
    [claim] = start_due(db)
    before = stored(db, task_id)

    def broken_output(*_args: Any) -> None:
        raise RuntimeError("the disk is full")

    async def wait_through_failures(tail: LiveTail) -> Sequence[LoggedEvent] | None:
        waiting = asyncio.ensure_future(tail.next_events(task_id, before[-1].seq, 0.5))
        await asyncio.sleep(0.05)
        with pytest.raises(LeaseLost):
            await asyncio.to_thread(write_output, db, dataclasses.replace(
                claim, owner_token="not-the-owner"), "late ")
        monkeypatch.setattr(worker_writes, "add_outputs", broken_output)
        with pytest.raises(RuntimeError):
            await asyncio.to_thread(write_output, db, claim, "lost ")
        return await waiting

    assert asyncio.run(with_tail(db, wait_through_failures)) is None
    assert stored(db, task_id) == before


def test_news_out_of_order_or_with_a_gap_makes_the_waiter_read(
    alice: Caller, model_id: str, db: Database, settings: Any
) -> None:
    """Two writers' commits may be heard in either order. Rows are handed over only
    while they run on from what the waiter holds, gapless: a later commit heard first
    makes it read, an earlier one heard after that wakes nobody, and a commit that
    continues rows already handed joins them."""
    task_id = create(alice, model_id)
    elsewhere = Database(create_db_engine(settings))  # writes here are not heard
    try:
        [claim] = start_due(elsewhere)
        seen = stored(db, task_id)[-1].seq
        for text in ("a ", "b ", "c "):
            write_output(elsewhere, claim, text)
        first, second, third = ([event] for event in stored(db, task_id, after=seen))
    finally:
        elsewhere.dispose()

    def tell(events: list[LoggedEvent]) -> None:
        """Announce `events` as a commit of this process that logged them would."""
        with db.write_events() as conn:
            logged(conn, [{"task_id": task_id, **event._asdict()} for event in events])

    async def hear(order: list[list[LoggedEvent]], after: int) -> Sequence[LoggedEvent] | None:
        async def run(tail: LiveTail) -> Sequence[LoggedEvent] | None:
            # The log holds these events already: let the tail's poll run before the
            # waiter comes (the next one is 10 s away), or it would wake it to read.
            await tail.next_events("no-such-task", 0, 0.05)
            waiting = asyncio.ensure_future(tail.next_events(task_id, after, 0.3))
            await asyncio.sleep(0.01)
            for events in order:  # on the loop's thread: all heard before the waiter runs
                tell(events)
            return await waiting
        return await with_tail(db, run)

    assert asyncio.run(hear([second, first], seen)) == ()  # a gap: read the log
    assert asyncio.run(hear([first, second, third], seen)) == first + second + third
    assert asyncio.run(hear([first, third], seen)) == ()  # handed one, then a gap
    assert asyncio.run(hear([first, second], seen + 2)) is None  # seen already: no wake
