"""Group commit for `POST /v1/responses`: requests that wait together commit together.

Each request is answered only after the transaction holding its task has committed,
exactly as with a plain `enqueue`; what changes is that the requests that arrived while
the previous commit was in flight share the next one (`core.store.new_tasks.enqueue_many`).
Under load a commit then carries tens of tasks for the price of one fsync; alone, a
request commits by itself at once (there is no waiting for company).

A batch is taken on the writer thread once its turn to write has come
(`Database.write_turn`), not when the thread is asked for: on SQLite the turn waits for
every other process's commit, and the requests that arrived meanwhile join the batch
instead of waiting for the next one (measured with two API processes: batches half as
big, so half the rate, when taken before the wait). On SQLite one drain loop per process
keeps at most one batch in flight (the store admits one writer anyway), so batches grow
with the load. PostgreSQL could commit several transactions at once, but one batch in
flight per process is the rule there too: a batch of births alone is one round trip
(`core.store.pg_async`), and measured with two API processes on 2 cores, one batch in
flight each against four gave twice the rate at half the CPU per request on both sides
(bigger batches, and the server's backends no longer contending for the same index
pages). A batch can stall, though, waiting on a row lock another transaction holds (a
dedupe or idempotency key): once every batch in flight has been out for
`STALLED_SECONDS`, another drain loop starts, up to `PARALLEL_BATCHES`, so a request
arriving then does not wait for that lock.

Before it takes a batch, a drain loop waits (briefly, `handlers.arrivals`) for the
request bodies this process was reading when it looked: they are the rest of the wave
the batch would otherwise leave for the next commit.

A request waits for its answer at most the process's store bound
(`handlers.threads.wait_seconds`), then hears `StoreTimeout` (503). One timer
(`_time_out`) keeps that bound for all of them, so it costs a request nothing but its
entry in `_waiting`. A request still queued then leaves the queue: it is never
written. One already in a batch may yet be committed when the store answers (a 503
tells the client to try again; its `Idempotency-Key` makes that safe). The drain loops
themselves wait on their store calls without a bound: a batch's answers are theirs to
give, however late.
"""

from __future__ import annotations

import asyncio
import threading
from functools import partial

from core.idempotency import IdempotencyClaim
from core.store.births import NewTask
from core.store.database import Database
from core.store.new_tasks import (
    BirthsInDoubt,
    Enqueued,
    births_alone,
    enqueue,
    enqueue_many,
    enqueue_many_async,
)
from core.store.pg_async import AutocommitConnections
from handlers.arrivals import Arrivals
from handlers.threads import StoreTimeout, group_writing, through_a_drop, wait_seconds

MAX_BATCH = 128
PARALLEL_BATCHES = 4
STALLED_SECONDS = 0.02  # a commit of births is a round trip and an fsync: milliseconds

_Answer = asyncio.Future[Enqueued]
_Pending = tuple[NewTask, IdempotencyClaim | None, _Answer]
_Outcome = tuple[_Answer, Enqueued | Exception]


class Enqueuer:
    def __init__(self, db: Database, *, idempotency_ttl_ms: int,
                 arrivals: Arrivals | None = None) -> None:
        self._db = db
        self._arrivals = arrivals
        self._ttl_ms = idempotency_ttl_ms
        self._pending: list[_Pending] = []
        self._taking = threading.Lock()  # the event loop adds, the writer thread takes
        self._parallel = 1 if db.single_writer else PARALLEL_BATCHES
        self._drainers: list[asyncio.Task[None]] = []  # held: the loop keeps tasks weakly
        self._out_since: dict[asyncio.Task[None], float] = {}  # each batch in flight
        self._recheck: asyncio.TimerHandle | None = None
        # Each unanswered request: when it came (loop time). Dicts keep their order,
        # so the oldest is first (`_time_out`).
        self._waiting: dict[_Answer, float] = {}
        self._watchdog: asyncio.TimerHandle | None = None
        self._connections = AutocommitConnections(db) if db.data_modifying_ctes else None

    async def close(self) -> None:
        """Close the connections of the batches committed on the event loop."""
        if self._connections is not None:
            await self._connections.close()

    async def enqueue(self, new: NewTask, claim: IdempotencyClaim | None) -> Enqueued:
        """What `core.store.new_tasks.enqueue` answers, once the task is committed;
        `StoreTimeout` once the store's bound has passed without an answer."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Enqueued] = loop.create_future()
        with self._taking:
            self._pending.append((new, claim, answer))
        self._waiting[answer] = loop.time()
        if self._watchdog is None:
            self._watchdog = loop.call_later(wait_seconds(), self._time_out)
        self._start_drainer()
        try:
            return await answer
        finally:
            self._waiting.pop(answer, None)

    def _time_out(self) -> None:
        """Answer `StoreTimeout` to the requests that have waited the bound, take those
        still queued out of the queue, and look again when the next one would be due."""
        self._watchdog = None
        loop = asyncio.get_running_loop()
        seconds = wait_seconds()
        late = loop.time() - seconds
        expired = set()
        for answer, since in self._waiting.items():
            if since > late:
                break
            expired.add(answer)
        if expired:
            with self._taking:
                self._pending = [p for p in self._pending if p[2] not in expired]
            for answer in expired:
                del self._waiting[answer]
                if not answer.done():
                    answer.set_exception(StoreTimeout())
        if self._waiting:
            oldest = next(iter(self._waiting.values()))
            self._watchdog = loop.call_at(oldest + seconds, self._time_out)

    def _start_drainer(self) -> None:
        """Start a drain loop if none runs, or if every batch in flight has stalled;
        else look again once the newest one would count as stalled.

        A drainer is done only once it found nothing pending (no await in between), and
        one between batches takes what is pending before it awaits, so a request just
        added is taken by a live drainer, by the one started here, or after the check."""
        loop = asyncio.get_running_loop()
        self._drainers = [drainer for drainer in self._drainers if not drainer.done()]
        if not self._pending or len(self._drainers) >= self._parallel:
            return
        if any(drainer not in self._out_since for drainer in self._drainers):
            return  # a drainer between batches takes it
        newest = max((self._out_since[drainer] for drainer in self._drainers),
                     default=float("-inf"))
        if loop.time() - newest >= STALLED_SECONDS:
            self._drainers.append(loop.create_task(self._drain()))
        elif self._recheck is None:
            self._recheck = loop.call_at(newest + STALLED_SECONDS, self._look_again)

    def _look_again(self) -> None:
        self._recheck = None
        self._start_drainer()

    async def _drain(self) -> None:
        this = asyncio.current_task()
        assert this is not None
        try:
            while self._pending:
                if self._arrivals is not None:
                    await self._arrivals.read()
                self._out_since[this] = asyncio.get_running_loop().time()
                await self._drain_one()
                del self._out_since[this]
        finally:
            self._out_since.pop(this, None)

    async def _drain_one(self) -> None:
        """Commit the next batch and answer each of its requests."""
        # A single writer takes its batch once its turn has come; where writers
        # run side by side there is no turn to wait for, and a batch taken now
        # cannot leave another drainer's hop with nothing to do.
        batch = None if self._db.single_writer else self._take()
        if batch is not None and births_alone(self._db, [(n, c) for n, c, _ in batch]):
            outcomes = await self._commit_on_loop(batch)
        else:
            outcomes = await group_writing(self._db, self._commit_next, batch)
        for answer, outcome in outcomes:
            if answer.done():  # the client went away
                continue
            if isinstance(outcome, Exception):
                answer.set_exception(outcome)
            else:
                answer.set_result(outcome)

    def _take(self) -> list[_Pending]:
        with self._taking:
            batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
        return batch

    def _commit_next(self, batch: list[_Pending] | None) -> list[_Outcome]:
        """Runs on the writer thread: `batch`, or once its turn to write has come the
        requests waiting then, committed as one batch."""
        try:
            with self._db.write_turn():
                if batch is None:
                    batch = self._take()
                outcomes = self._commit([(new, claim) for new, claim, _ in batch])
        except Exception as exc:  # the batch (or the turn) failed: each request hears why
            batch = self._take() if batch is None else batch
            outcomes = [exc] * len(batch)
        return [(answer, outcome) for (_, _, answer), outcome in zip(batch, outcomes)]

    async def _commit_on_loop(self, batch: list[_Pending]) -> list[_Outcome]:
        """A batch whose one statement commits by itself, run on the event loop; what
        it left alone (a dedupe hit, a failure) then on the writer thread, and so is
        a batch whose statement lost its connection (`_settled`)."""
        assert self._connections is not None
        requests = [(new, claim) for new, claim, _ in batch]
        try:
            done = await enqueue_many_async(self._db, self._connections, requests,
                                            idempotency_ttl_ms=self._ttl_ms)
        except BirthsInDoubt as doubt:
            outcomes = await group_writing(self._db, self._settled, requests, doubt)
        else:
            outcomes = (await group_writing(self._db, self._commit, requests, done)
                        if None in done else done)  # type: ignore[assignment]  # no None
        return [(answer, outcome) for (_, _, answer), outcome in zip(batch, outcomes)]

    def _settled(
        self, requests: list[tuple[NewTask, IdempotencyClaim | None]], doubt: BirthsInDoubt
    ) -> list[Enqueued | Exception]:
        """On the writer thread, as its pauses between the store's tries must not
        hold the event loop: the batch's births read back after the lost connection,
        those that landed answered as made and the others made again
        (`BirthsInDoubt.settle`), then each request it left alone as `_commit` does. A
        store still away is every request's answer (`503`): none is made afresh while
        it may have landed."""
        try:
            done = doubt.settle()
        except Exception as exc:  # answered to each request of the batch
            return [exc] * len(requests)
        return self._commit(requests, done)

    def _commit(
        self, requests: list[tuple[NewTask, IdempotencyClaim | None]],
        done: list[Enqueued | None] | None = None,
    ) -> list[Enqueued | Exception]:
        """The batch (unless `done` holds its answers already), then each request it
        left alone, made once more if the store dropped its connection before its
        COMMIT (`through_a_drop`)."""
        if done is None and len(requests) <= 1:
            done = [None] * len(requests)
        elif done is None:
            done = enqueue_many(self._db, requests, idempotency_ttl_ms=self._ttl_ms)
        outcomes: list[Enqueued | Exception] = []
        for (new, claim), answer in zip(requests, done):
            if answer is None:
                try:
                    answer = through_a_drop(partial(enqueue, self._db, new, idempotency=claim,
                                                    idempotency_ttl_ms=self._ttl_ms))
                except Exception as exc:  # answered to its own request
                    outcomes.append(exc)
                    continue
            outcomes.append(answer)
        return outcomes
