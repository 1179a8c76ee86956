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

from core.store import worker_writes
from core.store.database import Database
from core.thread_names import named_thread
from scheduler.attempt import Attempt, Outcome
from scheduler.execute import GOING, FlushWanted, Follower, Step, settled_step
from scheduler.group_commit import write_failed

log = logging.getLogger(__name__)

Result = Callable[[], Outcome | None]
Done = Callable[[Attempt, Result], None]


def join_window_ms(flush_interval_ms: int) -> int:
    """How much earlier than due an attempt's text joins another's flush: half the flush
    interval. Streams of one upstream get their tokens in the same decode step, so one
    whose flushes fell a step behind the others' stays that far behind; at a quarter
    interval a step (26-30 ms for llama-server's 4 streams on 2 cores) was too far to
    join, and it wrote alone at every interval. With half, a group due later than half
    an interval after another joins that one at its own flush: any two groups merge."""
    return flush_interval_ms // 2


@dataclass(eq=False)
class _Followed:
    follower: Follower
    wake_at_ms: int = 0  # when `wait` said its time is due
    # Done: a wake-up its inbox sent just before the step that ended it may still
    # bring it back among the news, and must not make it followed again.
    ended: bool = False


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
        followed = _Followed(follower)
        follower.attempt.inbox.notify = lambda: self._wake(followed)
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
        """Step each of `due` with its news; write the flushes they want, with those of
        the others due within the join window, in one transaction; step again those
        that wrote, until none wants a flush; then arm each inbox for its next wait."""
        clock = self._db.clock
        stepped = {f: self._step(f, f.follower.attempt.inbox.take_now()) for f in due}
        while wanted := {f: answer for f, answer in stepped.items()
                         if isinstance(answer, FlushWanted)}:
            until = clock.now_ms() + self._join_ms
            for other in list(self._followed):
                if other not in wanted and other.follower.due_by(until):
                    stepped[other] = answer = self._step(
                        other, other.follower.attempt.inbox.take_now(), flush_by_ms=until)
                    if isinstance(answer, FlushWanted):
                        wanted[other] = answer
            failures = self._write([w.write for w in wanted.values()])
            for (followed, _), failure in zip(wanted.items(), failures, strict=True):
                stepped[followed] = self._answer(followed,
                                                 partial(followed.follower.written, failure))
        now = clock.now_ms()
        for followed in stepped:
            if followed not in self._followed:
                continue
            wait_ms, room_bytes = followed.follower.wait(now)
            followed.wake_at_ms = now + int(wait_ms)
            if not followed.follower.attempt.inbox.arm(room_bytes):
                with self._lock:  # items came meanwhile: step it again at once
                    self._news.append(followed)

    def _step(self, followed: _Followed, items: list[Any], *,
              flush_by_ms: int | None = None) -> Step:
        return self._answer(followed,
                            lambda: followed.follower.step(items, flush_by_ms=flush_by_ms))

    def _answer(self, followed: _Followed, step: Callable[[], Step]) -> Step:
        """Run one step of `followed`; at its outcome (or a hand-over) it is done."""
        attempt = followed.follower.attempt
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


def _answered(outcome: Outcome | None) -> Outcome | None:
    return outcome


def _reraise(error: Exception) -> Outcome | None:
    raise error
