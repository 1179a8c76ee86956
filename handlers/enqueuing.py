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
with the load. PostgreSQL commits several transactions at once: up to `PARALLEL_BATCHES`
drain loops each take what is waiting, so a request that arrives during a commit does
not wait for it to end (measured: under load the acknowledgement was mostly that wait)
while batches still grow once they are all busy.
"""

from __future__ import annotations

import asyncio
import threading

from core.idempotency import IdempotencyClaim
from core.store.database import Database
from core.store.new_tasks import (
    Enqueued,
    NewTask,
    births_alone,
    enqueue,
    enqueue_many,
    enqueue_many_async,
)
from core.store.pg_async import AutocommitConnections
from handlers.threads import writing

MAX_BATCH = 128
PARALLEL_BATCHES = 4

_Answer = asyncio.Future[Enqueued]
_Pending = tuple[NewTask, IdempotencyClaim | None, _Answer]
_Outcome = tuple[_Answer, Enqueued | Exception]


class Enqueuer:
    def __init__(self, db: Database, *, idempotency_ttl_ms: int) -> None:
        self._db = db
        self._ttl_ms = idempotency_ttl_ms
        self._pending: list[_Pending] = []
        self._taking = threading.Lock()  # the event loop adds, the writer thread takes
        self._parallel = 1 if db.single_writer else PARALLEL_BATCHES
        self._drainers: list[asyncio.Task[None]] = []  # held: the loop keeps tasks weakly
        self._connections = AutocommitConnections(db) if db.data_modifying_ctes else None

    async def close(self) -> None:
        """Close the connections of the batches committed on the event loop."""
        if self._connections is not None:
            await self._connections.close()

    async def enqueue(self, new: NewTask, claim: IdempotencyClaim | None) -> Enqueued:
        """What `core.store.new_tasks.enqueue` answers, once the task is committed."""
        answer: asyncio.Future[Enqueued] = asyncio.get_running_loop().create_future()
        with self._taking:
            self._pending.append((new, claim, answer))
        # A drainer is done only once it found nothing pending (no await in between),
        # so the request just added is taken by a live one or by the one started here.
        self._drainers = [drainer for drainer in self._drainers if not drainer.done()]
        if len(self._drainers) < self._parallel:
            self._drainers.append(asyncio.get_running_loop().create_task(self._drain()))
        return await answer

    async def _drain(self) -> None:
        while self._pending:
            # A single writer takes its batch once its turn has come; where writers
            # run side by side there is no turn to wait for, and a batch taken now
            # cannot leave another drainer's hop with nothing to do.
            batch = None if self._db.single_writer else self._take()
            if batch is not None and births_alone(self._db, [(n, c) for n, c, _ in batch]):
                outcomes = await self._commit_on_loop(batch)
            else:
                outcomes = await writing(self._db, self._commit_next, batch)
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
        it left alone (a dedupe hit, a failure) then on the writer thread."""
        assert self._connections is not None
        requests = [(new, claim) for new, claim, _ in batch]
        done = await enqueue_many_async(self._db, self._connections, requests)
        outcomes: list[Enqueued | Exception] = (
            await writing(self._db, self._commit, requests, done)
            if None in done else done)  # type: ignore[assignment]  # no None in it
        return [(answer, outcome) for (_, _, answer), outcome in zip(batch, outcomes)]

    def _commit(
        self, requests: list[tuple[NewTask, IdempotencyClaim | None]],
        done: list[Enqueued | None] | None = None,
    ) -> list[Enqueued | Exception]:
        """The batch (unless `done` holds its answers already), then each request it
        left alone."""
        if done is None and len(requests) <= 1:
            done = [None] * len(requests)
        elif done is None:
            done = enqueue_many(self._db, requests, idempotency_ttl_ms=self._ttl_ms)
        outcomes: list[Enqueued | Exception] = []
        for (new, claim), answer in zip(requests, done):
            if answer is None:
                try:
                    answer = enqueue(self._db, new, idempotency=claim,
                                     idempotency_ttl_ms=self._ttl_ms)
                except Exception as exc:  # answered to its own request
                    outcomes.append(exc)
                    continue
            outcomes.append(answer)
        return outcomes
