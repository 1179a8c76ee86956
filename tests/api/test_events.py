"""The event log as JSON pages and as SSE (docs/events.md), and the live tail behind streams."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest

from core.errors import LeaseLost
from core.store import worker_writes
from core.store.connect import create_db_engine
from core.store.database import EVENTS_CHANNEL, Database
from core.store.tasks import log_positions
from handlers import live, sse
from handlers.live import LiveTail
from tests.api.helpers import Caller, complete_due, finish, output_events, start_due
from tests.thread_switches import voluntary_switches

SSE = {"Accept": "text/event-stream"}
LIFE = ["response.created", "response.loading", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]


def create(who: Caller, model_id: str) -> str:
    return who.post("/v1/responses", json={"model": model_id, "input": "words=3"}).json()["id"]


def finished_task(who: Caller, model_id: str, db: Database) -> str:
    task_id = create(who, model_id)
    complete_due(db)
    return task_id


def parse_sse(text: str) -> list[dict[str, Any]]:
    """Blocks of `id`/`event`/`data` lines; comment lines are kept as `{"comment"}`."""
    events: list[dict[str, Any]] = []
    block: dict[str, Any] = {}
    for line in text.split("\n"):
        if line.startswith(":"):
            events.append({"comment": line})
        elif line == "":
            if block:
                events.append(block)
            block = {}
        else:
            key, _, value = line.partition(": ")
            block[key] = value
    return events


def test_events_come_in_json_pages(alice: Caller, model_id: str, db: Database) -> None:
    task_id = finished_task(alice, model_id, db)
    first = alice.get(f"/v1/tasks/{task_id}/events", params={"limit": 4}).json()
    assert [e["seq"] for e in first["data"]] == [1, 2, 3, 4]
    assert first["next_after"] == 4
    rest = alice.get(f"/v1/tasks/{task_id}/events", params={"after": 4}).json()
    assert [e["type"] for e in first["data"] + rest["data"]] == LIFE
    assert rest["next_after"] is None  # finished, and nothing more will come


def test_event_data_carries_type_sequence_number_and_the_response(
    alice: Caller, model_id: str, db: Database
) -> None:
    task_id = finished_task(alice, model_id, db)
    events = alice.get(f"/v1/tasks/{task_id}/events").json()["data"]
    for item in events:
        assert (item["data"]["type"], item["data"]["sequence_number"]) == (
            item["type"], item["seq"])
    assert events[0]["data"]["response"]["status"] == "queued"
    assert events[-1]["data"]["response"]["status"] == "completed"


def test_an_unfinished_task_keeps_a_cursor(alice: Caller, model_id: str) -> None:
    task_id = create(alice, model_id)
    page = alice.get(f"/v1/tasks/{task_id}/events").json()
    assert (len(page["data"]), page["next_after"]) == (1, 1)


def test_sse_frames_each_event_and_closes_after_the_terminal_one(
    alice: Caller, model_id: str, db: Database
) -> None:
    task_id = finished_task(alice, model_id, db)
    answer = alice.get(f"/v1/tasks/{task_id}/events", headers=SSE)
    assert answer.headers["content-type"].startswith("text/event-stream")
    blocks = parse_sse(answer.text)
    assert [b["event"] for b in blocks] == LIFE
    assert [int(b["id"]) for b in blocks] == list(range(1, len(LIFE) + 1))
    for block in blocks:
        data = json.loads(block["data"])  # one line of JSON
        assert (data["type"], data["sequence_number"]) == (block["event"], int(block["id"]))


@pytest.mark.parametrize("resume", [{"headers": {"Last-Event-ID": "4"}},
                                    {"params": {"after": 4}}])
def test_sse_resumes_after_the_given_event(
    alice: Caller, model_id: str, db: Database, resume: dict[str, Any]
) -> None:
    task_id = finished_task(alice, model_id, db)
    headers = {**SSE, **resume.get("headers", {})}
    answer = alice.get(f"/v1/tasks/{task_id}/events", headers=headers,
                       params=resume.get("params"))
    assert [b["event"] for b in parse_sse(answer.text)] == LIFE[4:]


def test_sse_after_the_end_of_a_finished_log_is_empty(
    alice: Caller, model_id: str, db: Database
) -> None:
    task_id = finished_task(alice, model_id, db)
    answer = alice.get(f"/v1/tasks/{task_id}/events", headers={**SSE, "Last-Event-ID": "10"})
    assert (answer.status_code, answer.text) == (200, "")


def test_sse_resumed_past_the_end_of_a_live_log_closes_once_the_task_finishes(
    alice: Caller, model_id: str, db: Database
) -> None:
    """A client ahead of the log (`Last-Event-ID` beyond its end) gets nothing it has
    "seen", and its stream ends with the task rather than sending keep-alives for ever."""
    task_id = create(alice, model_id)

    def live_worker() -> None:
        (claim,) = start_due(db)
        threading.Event().wait(0.3)
        finish(db, claim)

    worker = threading.Thread(target=live_worker)
    worker.start()
    answers: list[Any] = []
    reader = threading.Thread(daemon=True, target=lambda: answers.append(alice.get(
        f"/v1/tasks/{task_id}/events", headers={**SSE, "Last-Event-ID": "500"})))
    reader.start()
    reader.join(10)
    worker.join()
    if not answers:  # end it as a stopping server would, so the test fails, not hangs
        alice.http.blocking_portal.call(_close_waits, alice.http.app.state.services.tail)
        reader.join(10)
        pytest.fail("the stream outlived its task")
    assert answers[0].status_code == 200
    assert not [block for block in parse_sse(answers[0].text) if "event" in block]


async def _close_waits(tail: LiveTail) -> None:
    tail.close_waits()


def test_sse_follows_live_events_and_sends_bare_keepalives(
    alice: Caller, model_id: str, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sse, "KEEPALIVE_SECONDS", 0.2)
    task_id = create(alice, model_id)

    def live_worker() -> None:
        (claim,) = start_due(db)
        threading.Event().wait(0.7)  # idle long enough for keep-alives
        finish(db, claim)

    worker = threading.Thread(target=live_worker)
    worker.start()
    answer = alice.get(f"/v1/tasks/{task_id}/events", headers=SSE)
    worker.join()
    blocks = parse_sse(answer.text)
    assert [b["event"] for b in blocks if "event" in b] == LIFE
    assert {"comment": ": keepalive"} in blocks
    assert ": keepalive\n\n" not in answer.text  # never an empty event after it


def test_sse_resumed_past_the_end_of_a_growing_log_still_sends_keepalives(
    alice: Caller, model_id: str, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client ahead of a log that keeps growing is sent none of its events, so it
    gets a keep-alive once the interval has passed since the last byte sent, however
    often the log wakes the stream (a proxy's idle timeout would cut it otherwise)."""
    monkeypatch.setattr(sse, "KEEPALIVE_SECONDS", 0.3)
    task_id = create(alice, model_id)

    def busy_worker() -> None:
        (claim,) = start_due(db)
        for _ in range(30):  # an event every 50 ms: the stream never idles 0.3 s
            worker_writes.append_output(db, task_id, claim.owner_token,
                                        output_events(task_id, "w ")[2:], text="w ")
            threading.Event().wait(0.05)
        finish(db, claim)

    worker = threading.Thread(target=busy_worker)
    worker.start()
    answer = alice.get(f"/v1/tasks/{task_id}/events", headers={**SSE, "Last-Event-ID": "5000"})
    worker.join()
    blocks = parse_sse(answer.text)
    assert not [block for block in blocks if "event" in block]
    assert blocks.count({"comment": ": keepalive"}) >= 2


def test_sse_for_another_clients_task_is_404(
    alice: Caller, bob: Caller, model_id: str
) -> None:
    answer = bob.get(f"/v1/tasks/{create(alice, model_id)}/events", headers=SSE)
    assert (answer.status_code, answer.json()["code"]) == (404, "task_not_found")


def recorded_polls(monkeypatch: pytest.MonkeyPatch) -> list[set[str]]:
    """The task ids of each of the live tail's polls from now on, in order."""
    polls: list[set[str]] = []

    def recorded(store: Database, polled: list[str]) -> dict[str, int]:
        polls.append(set(polled))
        return log_positions(store, polled)

    monkeypatch.setattr(live, "log_positions", recorded)
    return polls


def test_the_live_tail_polls_once_per_tick_for_all_waiters(
    alice: Caller, model_id: str, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    task_ids = [create(alice, model_id) for _ in range(20)]
    polls = recorded_polls(monkeypatch)
    tail = LiveTail(db, interval_seconds=0.05)

    async def forty_waiters() -> list[bool]:
        await tail.start()
        try:
            return await asyncio.gather(*(tail.wait(task_id, 1, 0.5)
                                          for task_id in task_ids * 2))
        finally:
            await tail.stop()

    woken = asyncio.run(forty_waiters())
    assert woken == [False] * 40  # nothing happened: all timed out
    assert 3 <= len(polls) <= 15  # about one query per 50 ms tick, not 40 per tick
    assert set(task_ids) in polls  # each asks for all the watched tasks at once


def test_tasks_held_here_are_polled_only_as_a_safety_net(
    alice: Caller, model_id: str, db: Database, settings: Any,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task this process's workers hold logs every event through this process, whose
    commits wake its waiters: each tick polls only the other tasks, and all of them are
    polled every `HELD_POLL_SECONDS`, so a write from another process (a cancel, a
    takeover) still wakes a waiter of a held task by then."""
    held, free = create(alice, model_id), create(alice, model_id)
    elsewhere = Database(create_db_engine(settings))  # its commits are not heard here
    monkeypatch.setattr(live, "HELD_POLL_SECONDS", 0.4)
    polls = recorded_polls(monkeypatch)
    tail = LiveTail(db, interval_seconds=0.02)

    async def quiet_then_claimed_elsewhere() -> tuple[list[bool], bool, float]:
        await tail.start()
        try:
            quiet = list(await asyncio.gather(tail.wait(held, 1, 1.0), tail.wait(free, 1, 1.0)))
            waiting = asyncio.ensure_future(tail.wait(held, 1, 5))
            await asyncio.to_thread(start_due, elsewhere)
            claimed = asyncio.get_running_loop().time()
            woken = await waiting
            return quiet, woken, asyncio.get_running_loop().time() - claimed
        finally:
            await tail.stop()

    db.held_here.hold(held)
    try:
        quiet, woken, late = asyncio.run(quiet_then_claimed_elsewhere())
    finally:
        db.held_here.release(held)
        elsewhere.dispose()
    assert quiet == [False, False]
    ticks = [polled for polled in polls if free in polled]
    with_held = [polled for polled in polls if held in polled]
    assert len(ticks) >= 15  # the free task at every tick of the quiet second
    assert 1 <= len(with_held) <= 6  # the held one about every 0.4 s, not every tick
    assert woken is True and late < 2.0  # the safety poll saw the other process's claim


def test_the_poll_thread_sleeps_while_only_held_tasks_are_waited_on(
    alice: Caller, model_id: str, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With only tasks this process holds to follow, the poll thread does not tick at
    all between safety polls; streams that wait again after every flush of a held task
    do not wake it either."""
    held = create(alice, model_id)
    monkeypatch.setattr(live, "HELD_POLL_SECONDS", 0.5)
    polls = recorded_polls(monkeypatch)
    tail = LiveTail(db, interval_seconds=0.01)

    async def waiting_again_and_again() -> int:
        await tail.start()
        try:
            assert tail._poller is not None and tail._poller.native_id is not None
            poller = tail._poller.native_id
            await tail.wait(held, 1, 0.1)  # the first safety poll is behind us
            before = voluntary_switches(poller)
            for _ in range(20):  # as a stream re-waits after each flush
                await tail.wait(held, 1, 0.05)
            return voluntary_switches(poller) - before
        finally:
            await tail.stop()

    db.held_here.hold(held)
    try:
        slept = asyncio.run(waiting_again_and_again())
    finally:
        db.held_here.release(held)
    assert slept <= 25  # ticking at 10 ms: ~100 in the second; seen here: 4-7
    assert 1 <= len(polls) <= 5


def test_a_waited_task_let_go_here_is_polled_at_once_again(
    alice: Caller, model_id: str, db: Database, settings: Any,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """When this process's worker lets a waited task go, the poll thread hears it: a
    claim by another process afterwards wakes the waiter within ticks, not at the next
    safety poll (set far off here)."""
    task_id = create(alice, model_id)
    elsewhere = Database(create_db_engine(settings))  # its commits are not heard here
    monkeypatch.setattr(live, "HELD_POLL_SECONDS", 60.0)
    tail = LiveTail(db, interval_seconds=0.02)

    async def let_go_then_claimed_elsewhere() -> tuple[bool, float]:
        await tail.start()
        try:
            waiting = asyncio.ensure_future(tail.wait(task_id, 1, 10))
            await asyncio.sleep(0.2)  # the first safety poll is done; now it sleeps
            await asyncio.to_thread(db.held_here.release, task_id)
            await asyncio.to_thread(start_due, elsewhere)
            claimed = asyncio.get_running_loop().time()
            woken = await waiting
            return woken, asyncio.get_running_loop().time() - claimed
        finally:
            await tail.stop()

    db.held_here.hold(task_id)
    try:
        woken, late = asyncio.run(let_go_then_claimed_elsewhere())
    finally:
        db.held_here.release(task_id)
        elsewhere.dispose()
    assert woken is True and late < 1.0


def test_the_live_tail_wakes_a_waiter_when_its_log_grows(
    alice: Caller, model_id: str, db: Database
) -> None:
    task_id = create(alice, model_id)
    tail = LiveTail(db, interval_seconds=0.02)

    async def wait_while_a_worker_claims() -> bool:
        await tail.start()
        try:
            waiting = asyncio.ensure_future(tail.wait(task_id, 1, 5))
            await asyncio.sleep(0.1)
            await asyncio.to_thread(start_due, db)
            return await waiting
        finally:
            await tail.stop()

    assert asyncio.run(wait_while_a_worker_claims()) is True


def test_a_poll_that_finds_nothing_new_leaves_the_event_loop_alone(
    alice: Caller, model_id: str, db: Database, settings: Any
) -> None:
    """The poll runs on its own thread and calls into the loop only for a log that grew
    past a waiter: quiet ticks cost the loop nothing, and a commit no listener of this
    process heard (another process's) still wakes its waiter at the next tick."""
    task_id = create(alice, model_id)
    elsewhere = Database(create_db_engine(settings))  # its commits are not heard here
    tail = LiveTail(db, interval_seconds=0.02)
    calls: list[str] = []

    async def quiet_then_grown() -> tuple[bool, list[str], bool, float]:
        loop = asyncio.get_running_loop()
        original = loop.call_soon_threadsafe

        def counted(callback: Any, *args: Any, **kwargs: Any) -> Any:
            calls.append(threading.current_thread().name)
            return original(callback, *args, **kwargs)

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign,assignment]
        await tail.start()
        try:
            quiet = await tail.wait(task_id, 1, 0.3)  # about 15 polls, nothing new
            during_quiet = list(calls)
            waiting = asyncio.ensure_future(tail.wait(task_id, 1, 5))
            await asyncio.sleep(0.05)
            await asyncio.to_thread(start_due, elsewhere)
            committed = loop.time()
            grown = await waiting
            return quiet, during_quiet, grown, loop.time() - committed
        finally:
            await tail.stop()

    try:
        quiet, during_quiet, grown, late = asyncio.run(quiet_then_grown())
    finally:
        elsewhere.dispose()
    assert quiet is False and during_quiet == []  # no thread called into the loop
    assert grown is True and late < 0.5
    assert "taskward-live-tail" in calls


def test_logged_events_are_heard_once_committed_and_readable(
    alice: Caller, model_id: str, db: Database
) -> None:
    """Each of a worker's event writes is heard after its commit: a reader on another
    connection, asked from the listener itself, already finds the events. A write that
    its fence refuses is not heard. (SQLAlchemy's `commit` event comes before the
    commit; a tail woken by it read the old log and slept a whole tick.)"""
    task_id = create(alice, model_id)
    heard: list[tuple[str, int]] = []
    unlisten = db.listen(EVENTS_CHANNEL, lambda logged: heard.append(
        (logged.task_id, log_positions(db, [logged.task_id])[logged.task_id])))
    try:
        [claim] = start_due(db)  # the claim (1 event), the start (1)
        finish(db, claim)  # output (3 events), then the completion (4)
        with pytest.raises(LeaseLost):  # a stale owner writes nothing
            worker_writes.append_output(db, task_id, "not-the-owner",
                                        output_events(task_id, "late"), text="late")
    finally:
        unlisten()
    assert heard == [(task_id, 2), (task_id, 3), (task_id, 6), (task_id, 10)]


def test_events_logged_in_this_process_wake_the_tail_before_its_tick(
    alice: Caller, model_id: str, db: Database, settings: Any
) -> None:
    """A tail polling every 10 s hears of output and a completion written through the
    same store object (`taskward run`'s sweeper) at once; writes through another one
    (a sweeper in another process) wait for the tick."""
    elsewhere = Database(create_db_engine(settings))

    async def woken_by(store: Database, task_id: str) -> list[bool]:
        tail = LiveTail(db, interval_seconds=10)
        await tail.start()
        try:
            waiting = asyncio.ensure_future(tail.wait(task_id, 1, 2))
            await asyncio.sleep(0.1)  # the first poll has run: the next is 10 s away
            [claim] = await asyncio.to_thread(start_due, store)
            first = await waiting
            page = await asyncio.to_thread(sse.read_events_page, db, task_id, None, 0, 100)
            waiting = asyncio.ensure_future(tail.wait(task_id, page.last_seq, 2))
            await asyncio.sleep(0.05)
            await asyncio.to_thread(finish, store, claim)
            return [first, await waiting]
        finally:
            await tail.stop()

    try:
        assert asyncio.run(woken_by(elsewhere, create(alice, model_id))) == [False, False]
        assert asyncio.run(woken_by(db, create(alice, model_id))) == [True, True]
    finally:
        elsewhere.dispose()
