"""One thread that follows every streaming attempt of a worker process.

A streaming attempt's runner does little per wake-up: it takes the chunks its inbox
gathered, and about once per flush interval writes them. With a runner thread per
attempt, every stream woke its own thread for its first text after a flush and again
for the flush, and the attempts flushing together woke each other to share the
transaction and then waited for its leader's write: ~1.8 thread switches per token at
8 streams. Here one thread follows all of them (`scheduler.execute.Follower`): an
inbox's wake-up wakes this thread, which steps whichever attempts have news or a time
due; the flushes those steps want are written in one transaction, together with those
of the other attempts whose text falls due within the join window (`join_window_ms`),
each fenced on its own. Nobody waits for anybody, and a join costs no wake-up: 40 %
fewer switches per streamed token. The CPU stayed where it was: most of it is the
flush's transaction, which costs ~3.5 times its back-to-back CPU when written after the
thread slept an interval (docs/benchmarks.md, "Thirty-third wave"; `bench.flush_gap`).

A flush refused because another transaction holds a row of its task past the store's
bound (`core.store.outage.is_row_held`: an operator's `SELECT ... FOR UPDATE`; the
others of its transaction are written without it, `worker_writes.append_outputs`)
leaves its attempt waiting, not stepped, while the others stream on: the same flush is
tried again alone every `HELD_RETRY_MS` (`worker_writes.append_alone`, a brief wait
each), and once it lands the attempt streams on from where it was. One line says so
when the hold begins and one when it ends. An attempt that must stop meanwhile gives
up: a lost lease ends it `lost`, any other stop as a failed write. A worker parks a
completion a held row refused here the same way (`park`): its attempt is no longer
followed, only that completion, tried again apart (`completion.complete_apart`).

An attempt ends here (an outcome, its completion handed to the group commit, or a step
that raised anything but a fenced failure) and `done(attempt, result)` is called on
this thread: it must not block. `result()` answers the outcome (None: handed over) or
raises what the step raised, so that whoever settles the attempt applies its one policy
for a failure (`scheduler.workers`: lost, its lease will expire and the task's policy
applies).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from core.errors import LeaseLost
from core.store import worker_writes
from core.store.database import Database
from core.store.outage import is_row_held, outage_cause
from core.thread_names import named_thread
from scheduler.attempt import Attempt, Outcome, StopReason
from scheduler.execute import GOING, FlushWanted, Follower, Step, settled_step
from scheduler.group_commit import write_failed

log = logging.getLogger(__name__)

Result = Callable[[], Outcome | None]
Done = Callable[[Attempt, Result], None]

# How often a flush a held row refused is tried again. An operator's hold lasts
# seconds; each try may keep every other stream waiting `ALONE_LOCK_WAIT_MS`.
HELD_RETRY_MS = 1000


def join_window_ms(flush_interval_ms: int) -> int:
    """How much earlier than due an attempt's text joins another's flush: half the flush
    interval. Streams of one upstream get their tokens in the same decode step, so one
    whose flushes fell a step behind the others' stays that far behind; at a quarter
    interval a step (26-30 ms for llama-server's 4 streams on 2 cores) was too far to
    join, and it wrote alone at every interval. With half, a group due later than half
    an interval after another joins that one at its own flush: any two groups merge."""
    return flush_interval_ms // 2


@dataclass(frozen=True)
class _Refused:
    """A write a held row refused: `retry()` writes it again alone (None: written, or
    why its fence did not hold; a store's error it raises), `then(failure)` is the
    attempt's next step once it is written or given up; `what` names it in the log
    lines, never its content."""

    what: str
    retry: Callable[[], Exception | None]
    then: Callable[[Exception | None], Step]


@dataclass(eq=False)
class _Followed:
    attempt: Attempt
    # None: only its refused write is followed (a parked completion, which ends it).
    follower: Follower | None
    wake_at_ms: int = 0  # when `wait` said its time is due
    # Done: a wake-up its inbox sent just before the step that ended it may still
    # bring it back among the news, and must not make it followed again.
    ended: bool = False
    # Its flush, refused for a row another transaction holds: tried again alone at
    # `wake_at_ms`, the attempt not stepped (its inbox not armed) until it lands.
    refused: _Refused | None = None


class StreamThread:
    def __init__(self, db: Database, *, join_ms: int, done: Done) -> None:
        self._db = db
        self._join_ms = join_ms
        self._done = done
        self._lock = threading.Lock()
        self._woken = threading.Condition(self._lock)
        self._news: list[_Followed] = []  # woken by their inbox, or new
        self._asleep = False
        self._stopping = False
        self._followed: set[_Followed] = set()  # this thread's only
        self._thread = named_thread(self._run, "stream-thread", kernel_name="streams")

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """End the thread; attempts still followed are left to their leases."""
        with self._lock:
            self._stopping = True
            self._woken.notify()
        self._thread.join(timeout)

    def follow(self, follower: Follower) -> None:
        """Follow `follower`'s attempt from now until it ends, then `done` it."""
        followed = _Followed(follower.attempt, follower)
        follower.attempt.inbox.notify = lambda: self._wake(followed)
        self._wake(followed)

    def park(self, attempt: Attempt, retry: Callable[[], Exception | None],
             then: Callable[[Exception | None], Step], held: Exception) -> None:
        """Follow `attempt`'s completion that the held row `held` refused until
        `retry()` writes it or the attempt must stop, then `done` it with
        `then(failure)`, as a refused flush is followed."""
        followed = _Followed(attempt, None)
        self._refused(followed, _Refused("completion", retry, then), held)
        self._wake(followed)

    def _wake(self, followed: _Followed) -> None:
        with self._lock:
            self._news.append(followed)
            if self._asleep:
                self._asleep = False
                self._woken.notify()

    def _run(self) -> None:
        clock = self._db.clock
        while True:
            with self._lock:
                while not self._news and not self._stopping:
                    sleep_ms = min((f.wake_at_ms for f in self._followed), default=None)
                    if sleep_ms is not None:
                        sleep_ms -= clock.now_ms()
                        if sleep_ms <= 0:
                            break
                    self._asleep = True
                    self._woken.wait(None if sleep_ms is None else sleep_ms / 1000)
                    self._asleep = False
                if self._stopping:
                    return
                news = [f for f in self._news if not f.ended]
                self._news = []
            self._followed.update(news)
            now = clock.now_ms()
            due = dict.fromkeys(news)
            due.update(dict.fromkeys(f for f in self._followed if f.wake_at_ms <= now))
            try:
                self._pass(list(due))
            except Exception:  # a bug here must not stop every stream of the worker
                log.exception("the stream thread's pass failed")

    def _pass(self, due: list[_Followed]) -> None:
        """Step each of `due` with its news (one whose flush a held row refused: try
        that flush again, when due); write the flushes they want, with those of the
        others due within the join window, in one transaction; step again those that
        wrote, until none wants a flush; then arm each inbox for its next wait."""
        clock = self._db.clock
        stepped: dict[_Followed, Step] = {}
        for followed in due:
            if followed.refused is None:
                stepped[followed] = self._step(followed, followed.attempt.inbox.take_now())
            elif followed.wake_at_ms <= clock.now_ms():
                self._retry_refused(followed, stepped)
        while wanted := {f: answer for f, answer in stepped.items()
                         if isinstance(answer, FlushWanted)}:
            until = clock.now_ms() + self._join_ms
            for other in list(self._followed):
                if (other not in wanted and other.follower is not None
                        and other.refused is None and other.follower.due_by(until)):
                    stepped[other] = answer = self._step(
                        other, other.attempt.inbox.take_now(), flush_by_ms=until)
                    if isinstance(answer, FlushWanted):
                        wanted[other] = answer
            failures = self._write([w.write for w in wanted.values()])
            for (followed, answer), failure in zip(wanted.items(), failures, strict=True):
                if failure is not None and is_row_held(failure):
                    del stepped[followed]
                    self._refused(followed, self._flush_refused(followed, answer.write),
                                  failure)
                    continue
                stepped[followed] = self._answer(followed, partial(_written, followed, failure))
        now = clock.now_ms()
        for followed in stepped:
            if followed not in self._followed or followed.follower is None:
                continue
            wait_ms, room_bytes = followed.follower.wait(now)
            followed.wake_at_ms = now + int(wait_ms)
            if not followed.attempt.inbox.arm(room_bytes):
                with self._lock:  # items came meanwhile: step it again at once
                    self._news.append(followed)

    def _flush_refused(self, followed: _Followed, write: worker_writes.OutputWrite
                       ) -> _Refused:
        return _Refused("output", partial(worker_writes.append_alone, self._db, write),
                        partial(_written, followed))

    def _refused(self, followed: _Followed, refused: _Refused, held: Exception) -> None:
        """Hold `followed` back with its `refused` write, tried again `HELD_RETRY_MS`
        from now, or sooner when the attempt may have to stop (its lease's end, its
        deadline: it is not stepped, so nothing else wakes it); said once, as the hold
        begins."""
        if followed.refused is None:
            log.warning("task %s: a row of it is held by another transaction (%s); its "
                        "%s waits, tried again every %d ms", followed.attempt.task_id,
                        outage_cause(getattr(held, "orig", held)), refused.what,
                        HELD_RETRY_MS)
        followed.refused = refused
        now = self._db.clock.now_ms()
        followed.wake_at_ms = now + min(HELD_RETRY_MS,
                                        followed.attempt.ms_until_timed_stop(now))

    def _retry_refused(self, followed: _Followed, stepped: dict[_Followed, Step]) -> None:
        """Write `followed`'s refused write again, alone; once it lands the attempt goes
        on (its next step in `stepped`). Still held, it waits for the next try, unless
        the attempt must stop: a lost lease, which forbids the write, ends it `lost`;
        any other stop ends it with the held row's error, as a failed write."""
        refused = followed.refused
        assert refused is not None
        attempt = followed.attempt
        lost = LeaseLost(attempt.task_id)
        failure = (lost if attempt.stop_reason() is StopReason.LOST
                   else worker_writes.answered_alone(refused.retry))
        if failure is not None and is_row_held(failure):
            reason = attempt.stop_reason()
            if reason is None:
                self._refused(followed, refused, failure)
                return
            if reason is StopReason.LOST:
                failure = lost
        followed.refused = None
        if failure is None:
            log.info("task %s: the row held by another transaction is free; its %s is "
                     "written", attempt.task_id, refused.what)
        stepped[followed] = self._answer(followed, partial(refused.then, failure))

    def _step(self, followed: _Followed, items: list[Any], *,
              flush_by_ms: int | None = None) -> Step:
        follower = followed.follower
        assert follower is not None  # a parked completion is never stepped
        return self._answer(followed, lambda: follower.step(items, flush_by_ms=flush_by_ms))

    def _answer(self, followed: _Followed, step: Callable[[], Step]) -> Step:
        """Run one step of `followed`; at its outcome (or a hand-over) it is done."""
        attempt = followed.attempt
        result: Result
        try:
            answer = settled_step(self._db, attempt, step)
            if answer is GOING or isinstance(answer, FlushWanted):
                return answer
            result = partial(_answered, answer if isinstance(answer, Outcome) else None)
        except Exception as exc:  # settled where every attempt's failure is
            answer, result = None, partial(_reraise, exc)
        self._followed.discard(followed)
        followed.ended = True
        try:
            self._done(attempt, result)
        except Exception:  # the thread goes on for the others
            log.exception("task %s: settling failed", attempt.task_id)
        return answer

    def _write(self, writes: list[worker_writes.OutputWrite]) -> list[Exception | None]:
        """The flushes in one transaction, each fenced on its own; when the transaction
        itself fails, every one of them fails with it."""
        try:
            return worker_writes.append_outputs(self._db, writes)
        except Exception as exc:
            return [write_failed(exc) for _ in writes]


def _written(followed: _Followed, failure: Exception | None) -> Step:
    """The next step of `followed`'s attempt once its flush is written or refused."""
    assert followed.follower is not None  # only a follower wants flushes
    return followed.follower.written(failure)


def _answered(outcome: Outcome | None) -> Outcome | None:
    return outcome


def _reraise(error: Exception) -> Outcome | None:
    raise error
