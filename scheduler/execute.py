"""Running one claimed attempt to its outcome: decode, verify, load, generate, finish.

The runner following an attempt's stream (`Follower`: the calling thread, or a worker's
stream thread for all its attempts) never blocks on the engine: loading and generation
run on an engine thread that feeds the attempt's inbox, so flushes happen on time,
stop flags are seen at once and the execution timeout holds even when an engine
hangs. `execute_here` runs the engine on the calling thread first and streams after it,
for engines that return at once; one still running after a few milliseconds has its
stream followed as `execute` would (`scheduler.handoff`). Every write is fenced by the
store: `CancelRequested` ends in `cancelled`, `LeaseLost` ends the attempt without
another write.
"""

from __future__ import annotations

import json
import logging
import math
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from core.engines.base import (
    Chunk,
    Engine,
    EngineError,
    EngineOptions,
    GenerationRequest,
    ModelFile,
    ModelSource,
    NotStarted,
)
from core.engines.registry import engine_named
from core.engines.sampling import with_model_defaults
from core.errors import CancelRequested, DomainError, LeaseLost
from core.models_registry import verified_model_file
from core.settings import Settings
from core.store import completion, worker_writes
from core.store.database import Database
from core.stored_request import generation_request
from scheduler.attempt import WAKE, Attempt, Outcome, StopReason
from scheduler.backoff import retry_delay_ms
from scheduler.engine_threads import EngineThreads
from scheduler.group_commit import GroupCommit
from scheduler.output import Output

log = logging.getLogger(__name__)

INVALID_REQUEST = "invalid_request"
ENGINE_ERROR = "engine_error"
TIMEOUT = "timeout"


@dataclass(frozen=True)
class _Loaded:
    """The engine thread finished loading the model, at `at_ms`: the start's write is
    timed from then, whenever the stream sees it (`execute_here` streams after the
    engine, or a runner takes over a few milliseconds after its start)."""

    at_ms: int


@dataclass(frozen=True)
class _Ended:
    """Generation returned (on its own, or because `should_stop` said so)."""


@dataclass(frozen=True)
class _Raised:
    error: BaseException


@dataclass(frozen=True)
class FlushWanted:
    """A step's answer: write `write` (with whatever other attempts flush now), then
    tell the follower `written`, then step it again."""

    write: worker_writes.OutputWrite


GOING = object()  # a step's answer: nothing to do until the inbox or a time wakes it
Step = Outcome | FlushWanted | object | None


VerifyModel = Callable[[str], tuple[str, ModelSource]]
# Writes a completion: `Outcome.COMPLETED` once written (raising its fenced failure), or
# None when whoever writes it settles the attempt afterwards (`written`).
Complete = Callable[[completion.Completion], Outcome | None]
# Follows an attempt's stream to its outcome (`follow_here`: on the calling thread), or
# hands it to a thread that follows many (`scheduler.stream_thread`): then None.
Follow = Callable[["Follower"], "Outcome | None"]


def execute(
    db: Database,
    settings: Settings,
    attempt: Attempt,
    *,
    verify: VerifyModel | None = None,
    complete: Complete | None = None,
    engines: EngineThreads | None = None,
    follow: Follow | None = None,
) -> Outcome | None:
    """Run `attempt` and return how it ended. Never raises for a task's own failure.

    `verify(model_id)` checks the model entry and file (default: `verified_model_file`
    now); a worker passes one shared by the attempts of one claim batch. `complete`
    writes the completion (default: a transaction of its own, waited for); a worker
    passes its group commit, which settles the attempt once written: then None. The
    engine runs on a thread of `engines`
    (default: one of its own); it normally ends with the attempt, and whoever owns
    `engines` stops them (a hung engine included). The stream is followed by `follow`
    (default: on this thread, each flush its own transaction); a worker's stream thread
    follows all its attempts and settles them itself: then None.
    """
    verify = verify or partial(verified_model_file, db, settings.models_dir)
    complete = complete or partial(_complete_alone, GroupCommit(
        partial(completion.complete_all, db)))
    engines = engines or EngineThreads(idle_limit=0)
    chosen = follow or partial(follow_here, db)

    def run(produce: Callable[[], None], stream: Callable[[Follow], Outcome | None]
            ) -> Outcome | None:
        engines.start(produce, f"engine-{attempt.task_id}")
        return stream(chosen)

    return _settled(db, attempt, lambda: _execute(db, settings, attempt, verify, complete, run))


def _complete_alone(commit: GroupCommit[completion.Completion],
                    item: completion.Completion) -> Outcome:
    commit.submit(item)
    return Outcome.COMPLETED


def written(db: Database, attempt: Attempt, failure: BaseException | None) -> Outcome:
    """The outcome of an attempt whose completion `complete` answered None for, once its
    group is written with `failure` (None, or the item's own): a cancel that came first
    ends in `cancelled`, a lost lease in nothing more; any other failure is raised."""
    def answer() -> Outcome:
        if failure is not None:
            raise failure
        return Outcome.COMPLETED

    outcome = _settled(db, attempt, answer)
    assert outcome is not None
    return outcome


Watch = Callable[[Callable[[], Outcome | None]], Callable[[], bool]]


def execute_here(
    db: Database, settings: Settings, attempt: Attempt, *, verify: VerifyModel,
    complete: Complete, watch: Watch, follow: Follow,
) -> Outcome | None:
    """`execute` with the engine run on the calling thread, which then streams what it
    made, unless the engine ran so long that `watch` handed the stream on
    (`scheduler.handoff`) to `follow`: then None, and whoever `follow` gives it settles
    it. `watch(stream)` is called as the engine starts; the check it returns, once the
    engine returned, says whether this thread still has the stream.
    """
    def run(produce: Callable[[], None], stream: Callable[[Follow], Outcome | None]
            ) -> Outcome | None:
        kept = watch(lambda: _settled(db, attempt, partial(stream, follow)))
        produce()
        return stream(partial(follow_here, db)) if kept() else None

    return _settled(db, attempt, lambda: _execute(db, settings, attempt, verify, complete, run))


def _settled(db: Database, attempt: Attempt, step: Callable[[], Outcome | None]) -> Outcome | None:
    """`step`'s outcome, a fenced failure turned into its own; the attempt ends with it
    unless the step handed its stream to another thread or its completion to a group
    commit that settles it (None)."""
    outcome = settled_step(db, attempt, step)
    assert outcome is None or isinstance(outcome, Outcome)
    return outcome


def settled_step(db: Database, attempt: Attempt, step: Callable[[], Step]) -> Step:
    """`step`'s answer, a fenced failure turned into its outcome; the attempt ends with
    an outcome (not with None, `GOING` or a `FlushWanted`: it goes on elsewhere)."""
    going = False
    try:
        answer = step()
        going = answer is None or answer is GOING or isinstance(answer, FlushWanted)
        return answer
    except CancelRequested:
        return _finish_cancelled(db, attempt)
    except LeaseLost:
        return Outcome.LOST
    finally:
        if not going:
            attempt.end()


RunEngine = Callable[[Callable[[], None], Callable[[Follow], Outcome | None]], Outcome | None]


def _execute(
    db: Database, settings: Settings, attempt: Attempt, verify: VerifyModel, complete: Complete,
    run: RunEngine,
) -> Outcome | None:
    claim = attempt.claim
    try:
        request = generation_request(claim.request_json)
    except Exception:  # whatever is stored, it must not stop the sweeper
        return _fail(db, attempt, INVALID_REQUEST, "the stored request cannot be decoded")
    try:
        engine_name, model_file = verify(claim.model)
        engine = engine_named(engine_name, partial(engine_options, settings))
    except EngineError as exc:
        return _engine_failed(db, settings, attempt, exc)
    except DomainError as exc:  # unknown_engine: the registry names an engine we lack
        return _fail(db, attempt, exc.code, exc.message)
    if isinstance(model_file, ModelFile):  # an upstream server applies its own defaults
        request = with_model_defaults(request, model_file.metadata)
    snapshot = json.loads(claim.snapshot_json) if claim.snapshot_json else None

    def stream(follow: Follow) -> Outcome | None:
        return follow(Follower(db, settings, attempt, complete))

    return run(partial(_produce, engine, model_file, request, snapshot, attempt), stream)


def engine_options(settings: Settings) -> EngineOptions:
    """The process's engine knobs: one decode loop serves up to all the worker's slots."""
    return EngineOptions(threads=settings.engine_threads, cache_size=settings.model_cache_size,
                         sequences=settings.worker_concurrency,
                         context_tokens=settings.engine_context_tokens,
                         host_lock=Path(settings.engine_host_lock) if settings.engine_host_lock
                         else None,
                         upstream_allowed_hosts=settings.upstream_host_patterns,
                         upstream_key_envs=settings.upstream_key_env_patterns,
                         upstream_cooldown_seconds=settings.upstream_cooldown_seconds,
                         upstream_concurrency=settings.upstream_concurrency)


def _produce(
    engine: Engine,
    model_file: ModelSource,
    request: GenerationRequest,
    snapshot: dict[str, Any] | None,
    attempt: Attempt,
) -> None:
    """The engine thread: every result, including a failure, goes to the inbox; chunks
    also straight from whatever thread the engine makes them on (`emit`)."""
    try:
        loaded = engine.load(model_file)
        attempt.inbox.put(_Loaded(attempt.clock.now_ms()))
        put_chunk = attempt.inbox.put_chunk
        for chunk in loaded.generate(request, snapshot, attempt.should_stop, put_chunk):
            put_chunk(chunk)
        attempt.inbox.put(_Ended())
    except BaseException as exc:  # handed to the runner, which decides
        attempt.inbox.put(_Raised(exc))


def follow_here(db: Database, follower: Follower) -> Outcome | None:
    """Follow one attempt's stream on this thread: sleep on its inbox, step, and write
    each flush it wants as a transaction of its own."""
    attempt, clock = follower.attempt, db.clock
    while True:
        wait_ms, room_bytes = follower.wait(clock.now_ms())
        answer = follower.step(attempt.inbox.take(wait_ms / 1000, room_bytes=room_bytes))
        while isinstance(answer, FlushWanted):
            worker_writes.append_one(db, answer.write)
            answer = follower.written(None)
        if answer is not GOING:
            assert answer is None or isinstance(answer, Outcome)
            return answer


class Follower:
    """What a runner does for one attempt, in steps: consume the engine's inbox until an
    outcome, flushing on time and size. Whoever drives it (`follow_here`, or the
    worker's stream thread for all its attempts) sleeps until the inbox or `wait`'s
    time wakes it, calls `step` with what the inbox holds, writes the flush a step
    wants (then `written`), and stops at an outcome.

    `loading -> running` is not a transaction of its own: it rides with the first
    flush, or with `complete` when generation ends before one, and at the latest one
    flush interval after the model loaded. Clients see the same events in the same
    order; a short task costs one write instead of two.
    """

    def __init__(self, db: Database, settings: Settings, attempt: Attempt,
                 complete: Complete) -> None:
        self._db = db
        self._settings = settings
        self.attempt = attempt
        self._output = Output(attempt.claim, interval_ms=settings.flush_interval_ms,
                              max_bytes=settings.flush_bytes, now_ms=db.clock.now_ms())
        self._writes = _Writes(db, attempt, self._output, complete,
                               running=attempt.claim.resumed)
        self._held: list[Any] = []  # taken, not yet handled: they follow a flush's write

    def wait(self, now: int) -> tuple[float, int | None]:
        """How long the driver may sleep (ms) and how many bytes of text it may sleep
        through (`Inbox.take`). Every flag, the engine's end, a chunk while no text is
        pending and a full flush wake it (scheduler/inbox.py); what else stops or writes
        comes with time: the deadline, the lease's end (the lapse is timed: `Attempt`),
        the pending flush or start. So an attempt whose upstream has queued it, or whose
        engine hangs, costs almost no wake-ups while it waits."""
        wait_ms = min(self.attempt.ms_until_timed_stop(now), self._writes.ms_until_due(now))
        return wait_ms, self._output.room_bytes()

    def due_by(self, at_ms: int) -> bool:
        """Whether pending text falls due for a time-based flush by `at_ms`."""
        due = self._output.due_at_ms()
        return due is not None and due <= at_ms

    def step(self, items: list[Any], *, flush_by_ms: int | None = None) -> Step:
        """Handle `items` (and any held back by a flush): an outcome, None (handed over),
        a `FlushWanted` (the items after it are held for the next step) or `GOING`.
        `flush_by_ms`: flush text due by then now (another attempt's write goes now)."""
        attempt, output, writes, clock = self.attempt, self._output, self._writes, self._db.clock
        items, self._held = self._held + items, []
        for index, item in enumerate(items or (WAKE,)):
            reason = attempt.stop_reason()
            # An engine that finished on its own completes even if a flag was raised
            # just now: the fenced `complete` still honours a cancel or a lost lease.
            natural_end = isinstance(item, _Ended) and not attempt.engine_stopped
            if reason is not None and not natural_end:
                if reason is StopReason.HAND_BACK:  # held chunks count as made
                    for held in items[index:]:
                        if isinstance(held, Chunk):
                            output.add(held, clock.now_ms())
                return _stop(self._db, self._settings, attempt, writes, reason)
            if isinstance(item, _Loaded):
                writes.loaded(item.at_ms + self._settings.flush_interval_ms)
            elif isinstance(item, Chunk):
                output.add(item, clock.now_ms())
                if output.full():
                    self._held = items[index + 1:]
                    return writes.flush_wanted()
            elif isinstance(item, _Ended):
                return writes.complete()
            elif isinstance(item, _Raised):
                return _engine_raised(self._db, self._settings, attempt, item.error)
        # Time-based flushes only once all that was taken is pending: chunks held while
        # text waited arrived before now, and belong in the flush that is due.
        now = clock.now_ms()
        if output.flush_due(now) or (flush_by_ms is not None and self.due_by(flush_by_ms)):
            return writes.flush_wanted()
        writes.start_if_due(now)
        return GOING

    def written(self, failure: Exception | None) -> Step:
        """The flush this follower wanted is written (`failure` None) or refused (raised:
        a fence that did not hold, or the group's write that failed); then the next step
        with what was held."""
        if failure is not None:
            raise failure
        self._writes.flushed()
        return self.step([])


class _Writes:
    """The attempt's fenced writes of output, each carrying the pending start if any."""

    def __init__(
        self, db: Database, attempt: Attempt, output: Output, complete: Complete, *,
        running: bool,
    ) -> None:
        self._db = db
        self._attempt = attempt
        self._output = output
        self._complete = complete
        self._running = running
        self._start_by_ms: int | None = None
        self._flush_started_ms = 0  # when the flush being written was taken

    def loaded(self, start_by_ms: int) -> None:
        if not self._running:
            self._start_by_ms = start_by_ms

    def ms_until_due(self, now: int) -> float:
        """How long until a pending flush or start is due (infinite: none is pending)."""
        due = [d for d in (self._output.ms_until_due(now), self._start_wait(now)) if d is not None]
        return min(due, default=float("inf"))

    def _start_wait(self, now: int) -> int | None:
        if self._running or self._start_by_ms is None:
            return None
        return max(0, self._start_by_ms - now)

    def start_if_due(self, now: int) -> None:
        if self._start_wait(now) == 0:
            worker_writes.start_running(self._db, self._attempt.task_id,
                                        self._attempt.claim.owner_token)
            self._running = True

    def flush_wanted(self) -> Step:
        """The pending text as a write for the driver to make (`GOING`: none pends)."""
        flush = self._output.take_flush()
        if flush is None:
            return GOING
        self._flush_started_ms = self._db.clock.now_ms()
        return FlushWanted(worker_writes.OutputWrite(
            self._attempt.task_id, self._attempt.claim.owner_token, flush.events,
            text=flush.text, snapshot_json=flush.snapshot_json, usage=flush.usage,
            start=not self._running, output_chars=self._output.stored_chars()))

    def flushed(self) -> None:
        self._running = True
        self._attempt.wrote(self._flush_started_ms)

    def flush_now(self) -> None:
        """Write the pending text at once, alone (a hand-back keeps what was made)."""
        wanted = self.flush_wanted()
        if isinstance(wanted, FlushWanted):
            worker_writes.append_one(self._db, wanted.write)
            self.flushed()

    def complete(self) -> Outcome | None:
        events, text = self._output.take_closing()
        return self._complete(completion.Completion(
            self._attempt.task_id, self._attempt.claim.owner_token, events, self._output.usage,
            text, start=not self._running, attempt=self._attempt.claim.attempt))


def _stop(
    db: Database, settings: Settings, attempt: Attempt, writes: _Writes, reason: StopReason
) -> Outcome:
    claim = attempt.claim
    if reason is StopReason.LOST:
        return Outcome.LOST
    if reason is StopReason.CANCEL:
        raise CancelRequested(claim.task_id)
    if reason is StopReason.HAND_BACK:
        writes.flush_now()  # a resume task keeps all it made
        worker_writes.release(db, claim.task_id, claim.owner_token, attempt=claim.attempt)
        return Outcome.RELEASED
    return _retry(db, settings, attempt, TIMEOUT, "the attempt exceeded the execution timeout")


def _engine_raised(
    db: Database, settings: Settings, attempt: Attempt, error: BaseException
) -> Outcome:
    if isinstance(error, EngineError):
        return _engine_failed(db, settings, attempt, error)
    # The message may quote the prompt or output: log where it broke, store only the type.
    log.error("task %s: engine raised %s\n%s", attempt.task_id, type(error).__name__,
              "".join(traceback.format_tb(error.__traceback__)))
    return _retry(db, settings, attempt, ENGINE_ERROR,
                  f"the engine failed unexpectedly ({type(error).__name__})")


def _engine_failed(
    db: Database, settings: Settings, attempt: Attempt, error: EngineError
) -> Outcome:
    wait_ms = wait_ms_of(error)
    if isinstance(error, NotStarted):  # nothing was sent: not worth an attempt
        worker_writes.release(db, attempt.task_id, attempt.claim.owner_token, delay_ms=wait_ms,
                              attempt=attempt.claim.attempt)
        return Outcome.RELEASED
    if error.retryable:
        return _retry(db, settings, attempt, error.code, error.message, floor_ms=wait_ms)
    return _fail(db, attempt, error.code, error.message)


def wait_ms_of(error: EngineError) -> int:
    """The least wait `error` asks for, in whole milliseconds, rounded up past the
    floating point's noise: truncated, a cool-down's 1.001 s left (1000.99… ms) brought
    the task back a millisecond before its URL was usable, to be handed back once more."""
    return math.ceil(round((error.retry_after_seconds or 0) * 1000, 6))


def _retry(
    db: Database, settings: Settings, attempt: Attempt, code: str, message: str, *,
    floor_ms: int = 0,
) -> Outcome:
    """Back to the queue after the backoff, never sooner than `floor_ms` (Retry-After)."""
    delay = max(floor_ms, retry_delay_ms(attempt.claim.attempt,
                                         base_seconds=settings.backoff_base_seconds,
                                         max_seconds=settings.backoff_max_seconds))
    requeued = worker_writes.requeue(db, attempt.task_id, attempt.claim.owner_token, delay_ms=delay,
                                     code=code, message=message, attempt=attempt.claim.attempt)
    return Outcome.REQUEUED if requeued else Outcome.DEAD_LETTERED


def _fail(db: Database, attempt: Attempt, code: str, message: str) -> Outcome:
    worker_writes.fail(db, attempt.task_id, attempt.claim.owner_token, code, message,
                       attempt=attempt.claim.attempt)
    return Outcome.FAILED


def _finish_cancelled(db: Database, attempt: Attempt) -> Outcome:
    try:
        worker_writes.finish_cancelled(db, attempt.task_id, attempt.claim.owner_token)
    except LeaseLost:
        return Outcome.LOST
    return Outcome.CANCELLED
