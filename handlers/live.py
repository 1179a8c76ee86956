"""Following tasks as they change: one poller per process, and the waits built on it.

Every SSE stream, long-poll (`?wait=`) and synchronous `background: false` request
waits on `LiveTail.wait` instead of querying the store itself. One thread polls
`last_seq` of all watched tasks in one statement every `poll_interval_ms` and wakes
those whose log has grown, so following N tasks costs one query per tick, not N.
Waiters compare against the store, not against notifications they might have missed,
so a wake-up is never lost; it only comes up to one tick late. The poll runs on a
thread of its own and calls into the event loop only when it found a log that grew
past a waiter: most polls find nothing (this process's own commits have woken their
waiters already), and each one taken through the store pool cost the loop a hop out
and back besides the query (docs/benchmarks.md, "the sixth wave").

Events logged by this very process (`taskward run`: its sweeper's claims, starts,
output, retries, completions, failures; `Database.write_events`) do not wait for the
tick: once their transaction has committed, the waiters of that task are woken at once,
without a poll. Such a wake may be spurious (the waiter's last read already held those
events); its caller reads again and waits again. Waking at the commit, and only after
it, matters: SQLAlchemy's `commit` event comes before the commit, and a poll run at it
found the old log and then slept a whole tick (docs/benchmarks.md).

Such a commit also says which rows it logged (`core.store.database.logged`). A waiter
whose log they continue exactly (the first is `seen_seq + 1`, and so on without a gap)
is handed them and need not read the log: an SSE stream sends them as they are. Anything
else wakes it to read: a poll, a commit that named no rows (a completion on
PostgreSQL), one that leaves a gap (another writer's commit whose news is still on its
way), or one heard after the waiter was already handed rows it does not continue. A
commit whose rows the waiter has already seen wakes nobody.

A task that this process's own workers hold (`Database.held_here`) logs every event
through this process, so its commits wake its waiters already; another process can
only cancel it, which the holding worker hears within its lease keeper's tick and
answers with events of its own. Such tasks are polled only every `HELD_POLL_SECONDS`,
a safety net: a stream of `taskward run` then costs the poll thread no query per tick,
and while only such tasks are waited on, the thread sleeps until that poll is due, a
waiter of another task comes, or a waited task is let go (another process may claim
it next, and then only a poll tells).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Row

from core.failure_streak import FailureStreak
from core.states import TERMINAL, Status
from core.store.database import EVENTS_CHANNEL, Database, Logged, LoggedEvent
from core.store.tasks import get_task, log_positions
from core.thread_names import named_thread
from handlers.threads import blocking

log = logging.getLogger("taskward.live")
_STOP_SECONDS = 2.0
HELD_POLL_SECONDS = 1.0  # how often the logs of tasks held here are polled regardless


@dataclass(eq=False)
class _Waiter:
    seen_seq: int
    woken: asyncio.Future[None] = field(repr=False)
    # Once woken: the events after `seen_seq` it was handed, in order; None: read the log.
    events: list[LoggedEvent] | None = None

    def read(self) -> None:
        """Wake it to read the log."""
        self.events = None
        if not self.woken.done():
            self.woken.set_result(None)

    def hear(self, events: tuple[LoggedEvent, ...]) -> None:
        """A local commit logged `events` of its task (empty: it did not say which)."""
        if not events:
            self.read()
            return
        if not self.woken.done():
            self.events = []
        elif self.events is None:
            return  # it reads the log anyway, after this commit
        held = self.seen_seq + len(self.events)
        if events[-1].seq <= held:
            if not self.woken.done():  # seen already: nothing to wake it for
                self.events = None
            return
        if events[0].seq != held + 1:
            self.read()
            return
        self.events.extend(events)
        if not self.woken.done():
            self.woken.set_result(None)


class LiveTail:
    def __init__(self, db: Database, interval_seconds: float) -> None:
        self._db = db
        self._interval = interval_seconds
        # Changed on the loop only; the poll thread reads it (a copy of the keys, a
        # lookup: atomic under the GIL, as a writer's `logged` lookup is).
        self._waiters: dict[str, list[_Waiter]] = {}
        self._work = threading.Event()  # set when a waiter comes, a waited task is let
        # go by this process's worker, or at stop
        self._stopping = threading.Event()
        self._idle = True  # the poll thread sleeps until `_work` is set, with no timeout
        self._poller: threading.Thread | None = None
        self._unlisten: Callable[[], None] = lambda: None
        self._closing = False  # set by `close_waits`: the server is going away
        self._poll_failures = FailureStreak(  # the poll thread's
            log, "live tail poll failed (%s, %d in a row); waiters retry by themselves",
            "live tail polls are back after %d failed attempts")

    async def start(self) -> None:
        loop = asyncio.get_running_loop()

        def logged(news: Logged) -> None:  # on the writer's thread, after its commit
            if news.task_id in self._waiters:  # a dict lookup: safe from any thread
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(self._heard, news)

        def released(task_id: str) -> None:  # on the worker's thread
            if task_id in self._waiters:
                self._work.set()

        unsubscribes = (self._db.listen(EVENTS_CHANNEL, logged),
                        self._db.held_here.on_release(released))

        def unlisten() -> None:
            for unsubscribe in unsubscribes:
                unsubscribe()

        self._unlisten = unlisten
        self._poller = named_thread(self._run, "taskward-live-tail", args=(loop,))
        self._poller.start()

    async def stop(self) -> None:
        """Stop polling; waits for a poll under way only so long (a store that does not
        answer must not hold up shutdown; the thread ends after that poll)."""
        self._unlisten()
        self._stopping.set()
        self._work.set()
        if self._poller is not None:
            await asyncio.to_thread(self._poller.join, _STOP_SECONDS)

    @property
    def closing(self) -> bool:
        """True once `close_waits` has run: whoever waits answers with what it has."""
        return self._closing

    def close_waits(self) -> None:
        """The server is stopping (on the loop's thread): wake every waiter now and let
        no later wait block, so every stream and long-poll ends at once. granian waits
        for each open connection to end before the app's shutdown hooks run (and, in
        `taskward run`, before its sweeper's drain), and an SSE stream of a queued task
        would never end by itself: its client resumes from the last `id` it read."""
        self._closing = True
        for waiting in list(self._waiters.values()):
            for waiter in waiting:
                waiter.read()

    async def wait(self, task_id: str, seen_seq: int, timeout: float) -> bool:
        """True once the task's log holds events after `seen_seq` (or the task is gone),
        or may hold them (a local commit logged some); False when `timeout` seconds pass
        first."""
        return await self.next_events(task_id, seen_seq, timeout) is not None

    async def next_events(
        self, task_id: str, seen_seq: int, timeout: float
    ) -> Sequence[LoggedEvent] | None:
        """As `wait`, with what woke it: the events after `seen_seq`, gapless and in
        order, as a commit of this process logged them; or `()`: read the log, which
        holds (or may hold) more. None when `timeout` seconds pass first. Once
        `closing`, `()` at once."""
        if self._closing:
            return ()
        waiter = _Waiter(seen_seq, asyncio.get_running_loop().create_future())
        self._waiters.setdefault(task_id, []).append(waiter)
        # The poll thread needs waking when it sleeps for want of waiters, and for a
        # task this process does not hold; not for the waiters of held tasks that
        # streams add after every flush, which its next safety poll covers.
        if ((self._idle or task_id not in self._db.held_here)
                and not self._work.is_set()):
            self._work.set()
        try:
            await asyncio.wait_for(waiter.woken, timeout)
            return waiter.events or ()
        except TimeoutError:
            return None
        finally:
            waiting = self._waiters.get(task_id, [])
            if waiter in waiting:
                waiting.remove(waiter)
            if not waiting:
                self._waiters.pop(task_id, None)

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        """The poll thread: one query per tick while anyone waits on a task this
        process does not hold, and one every `HELD_POLL_SECONDS` for all of them.
        `_idle` is set and `_work` cleared before the waiters are looked at, so a sleep
        for want of waiters ends at the next one that comes, and a sleep between
        safety polls at a waiter of a task not held here or a release of a waited one."""
        all_polled_at = 0.0
        while not self._stopping.is_set():
            self._idle = True  # before the look: a waiter added after it sees this
            self._work.clear()
            waited = list(self._waiters)
            if not waited:
                self._work.wait()
                continue
            self._idle = False
            now = time.monotonic()
            if now - all_polled_at >= HELD_POLL_SECONDS:
                all_polled_at, polled = now, waited
            else:
                held = self._db.held_here
                polled = [task_id for task_id in waited if task_id not in held]
            if polled:
                self._poll(loop, polled)
                self._stopping.wait(self._interval)
            else:  # all held here: nothing to poll until the safety poll is due
                self._work.wait(all_polled_at + HELD_POLL_SECONDS - now)

    def _poll(self, loop: asyncio.AbstractEventLoop, polled: list[str]) -> None:
        """Read the logs' positions of `polled`; wake the waiters behind them."""
        try:
            positions = log_positions(self._db, polled)
        except Exception as exc:  # a store outage: waiters time out and retry by themselves
            self._poll_failures.failed(exc)
            return
        self._poll_failures.succeeded()
        if self._behind(polled, positions):
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._wake, polled, positions)

    def _behind(self, polled: list[str], positions: dict[str, int]) -> bool:
        """Whether a waiter of `polled` may be behind its log (checked again on the loop,
        `_wake`, where the waiters change)."""
        return any(self._waiting_behind(polled, positions))

    def _waiting_behind(self, polled: list[str], positions: dict[str, int]) -> Iterator[_Waiter]:
        """The unwoken waiters of `polled` whose log holds more than they saw, or whose
        task is gone (no position). Each task's list is copied: the poll thread reads
        it while the loop may change it."""
        for task_id in polled:
            last_seq = positions.get(task_id)
            for waiter in list(self._waiters.get(task_id, ())):
                if not waiter.woken.done() and (last_seq is None or last_seq > waiter.seen_seq):
                    yield waiter

    def _heard(self, news: Logged) -> None:
        for waiter in self._waiters.get(news.task_id, []):
            waiter.hear(news.events)

    def _wake(self, polled: list[str], positions: dict[str, int]) -> None:
        for waiter in self._waiting_behind(polled, positions):
            waiter.read()


async def settled(
    db: Database, tail: LiveTail, task_id: str, owner: str | None, timeout: float,
    *, read: Callable[[Database, str, str | None], Row[Any]] = get_task,
) -> Row[Any]:
    """The task once it is finished, or as it stands after `timeout` seconds or once
    the server is stopping, as `read` gives it (`core.store.tasks.get_response` for a
    response object)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    task = await blocking(read, db, task_id, owner)
    while Status(task.status) not in TERMINAL and not tail.closing:
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        if await tail.wait(task_id, task.last_seq, remaining):
            task = await blocking(read, db, task_id, owner)
    return task

