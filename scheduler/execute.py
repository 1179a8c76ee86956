"""Running one claimed attempt to its outcome: decode, verify, load, generate, finish.

The runner thread calling `execute` never blocks on the engine: loading and generation
run on an engine thread that feeds the attempt's inbox, so flushes happen on time,
stop flags are seen at once and the execution timeout holds even when an engine
hangs. `execute_here` runs the engine on the calling thread first and streams after it,
for engines that return at once; one still running after a few milliseconds gets a
runner as `execute` gives it (`scheduler.handoff`). Every write is fenced by the store:
`CancelRequested` ends in `cancelled`, `LeaseLost` ends the attempt without another write.
"""

from __future__ import annotations

import json
import logging
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
from scheduler.flush_group import FlushGroup
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
class _FlushCalled:
    """Another attempt's flush calls this one's pending text into its transaction
    (`scheduler.flush_group`)."""


VerifyModel = Callable[[str], tuple[str, ModelSource]]
# Writes a completion: `Outcome.COMPLETED` once written (raising its fenced failure), or
# None when whoever writes it settles the attempt afterwards (`written`).
Complete = Callable[[completion.Completion], Outcome | None]


def execute(
    db: Database,
    settings: Settings,
    attempt: Attempt,
    *,
    verify: VerifyModel | None = None,
    complete: Complete | None = None,
    engines: EngineThreads | None = None,
    flushes: FlushGroup | None = None,
) -> Outcome | None:
    """Run `attempt` and return how it ended. Never raises for a task's own failure.

    `verify(model_id)` checks the model entry and file (default: `verified_model_file`
    now); a worker passes one shared by the attempts of one claim batch. `complete`
    writes the completion (default: a transaction of its own, waited for); a worker
    passes its group commit, which settles the attempt once written: then None. The
    engine runs on a thread of `engines`
    (default: one of its own); it normally ends with the attempt, and whoever owns
    `engines` stops them (a hung engine included). Output is flushed through `flushes`
    (default: a group of its own), which a worker shares between its attempts.
    """
    verify = verify or partial(verified_model_file, db, settings.models_dir)
    complete = complete or partial(_complete_alone, GroupCommit(
        partial(completion.complete_all, db)))
    engines = engines or EngineThreads(idle_limit=0)
    flushes = flushes or FlushGroup(db, join_ms=0)

    def run(produce: Callable[[], None], stream: Callable[[], Outcome | None]) -> Outcome | None:
        engines.start(produce, f"engine-{attempt.task_id}")
        return stream()

    return _settled(db, attempt, lambda: _execute(db, settings, attempt, verify, complete,
                                                  flushes, run))


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
    complete: Complete, watch: Watch, flushes: FlushGroup,
) -> Outcome | None:
    """`execute` with the engine run on the calling thread, which then streams what it
    made, unless the engine ran so long that `watch` handed the stream to a runner
    (`scheduler.handoff`): then None, and that runner's call of the stream returns the
    outcome (None too when `complete` settles it later). `watch(stream)` is called as
    the engine starts; the check it returns, once the engine returned, says whether
    this thread still has the stream.
    """
    def run(produce: Callable[[], None], stream: Callable[[], Outcome | None]) -> Outcome | None:
        kept = watch(lambda: _settled(db, attempt, stream))
        produce()
        return stream() if kept() else None

    return _settled(db, attempt, lambda: _execute(db, settings, attempt, verify, complete,
                                                  flushes, run))


def _settled(db: Database, attempt: Attempt, step: Callable[[], Outcome | None]) -> Outcome | None:
    """`step`'s outcome, a fenced failure turned into its own; the attempt ends with it
    unless the step handed its stream to another thread or its completion to a group
    commit that settles it (None)."""
    handed_over = False
    try:
        outcome = step()
        handed_over = outcome is None
        return outcome
    except CancelRequested:
        return _finish_cancelled(db, attempt)
    except LeaseLost:
        return Outcome.LOST
    finally:
        if not handed_over:
            attempt.end()


RunEngine = Callable[[Callable[[], None], Callable[[], Outcome | None]], Outcome | None]


def _execute(
    db: Database, settings: Settings, attempt: Attempt, verify: VerifyModel, complete: Complete,
    flushes: FlushGroup, run: RunEngine,
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
    return run(partial(_produce, engine, model_file, request, snapshot, attempt),
               partial(_stream, db, settings, attempt, complete, flushes))


def engine_options(settings: Settings) -> EngineOptions:
    """The process's engine knobs: one decode loop serves up to all the worker's slots."""
    return EngineOptions(threads=settings.engine_threads, cache_size=settings.model_cache_size,
                         sequences=settings.worker_concurrency,
                         context_tokens=settings.engine_context_tokens,
                         host_lock=Path(settings.engine_host_lock) if settings.engine_host_lock
                         else None,
                         upstream_allowed_hosts=settings.upstream_host_patterns,
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


def _stream(
    db: Database, settings: Settings, attempt: Attempt, complete: Complete, flushes: FlushGroup
) -> Outcome | None:
    """Consume the engine's inbox until an outcome; flush on time and size.

    `loading -> running` is not a transaction of its own: it rides with the first
    flush, or with `complete` when generation ends before one, and at the latest one
    flush interval after the model loaded. Clients see the same events in the same
    order; a short task costs one write instead of two.
    """
    clock = db.clock
    output = Output(attempt.claim, interval_ms=settings.flush_interval_ms,
                    max_bytes=settings.flush_bytes, now_ms=clock.now_ms())
    writes = _Writes(db, attempt, output, complete, flushes, running=attempt.claim.resumed)
    try:
        return _follow(db, settings, attempt, output, writes)
    finally:  # a leader must not wait for this attempt's flush
        writes.ending()


def _follow(
    db: Database, settings: Settings, attempt: Attempt, output: Output, writes: _Writes
) -> Outcome | None:
    """`_stream`'s loop."""
    clock = db.clock
    while True:
        now = clock.now_ms()
        # Every flag, the engine's end, a chunk while no text is pending and a full flush
        # wake the runner (scheduler/inbox.py); what else stops or writes comes with
        # time: the deadline, the lease's end (the lapse is timed: `Attempt`), the
        # pending flush or start. So a runner sleeps until then (looking once a second
        # at most) instead of on a tick: an attempt whose upstream has queued it, or
        # whose engine hangs, costs almost no wake-ups while it waits.
        wait_ms = min(attempt.ms_until_timed_stop(now), writes.ms_until_due(now))
        items = attempt.inbox.take(wait_ms / 1000, room_bytes=output.room_bytes())
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
                return _stop(db, settings, attempt, writes, reason)
            if isinstance(item, _Loaded):
                writes.loaded(item.at_ms + settings.flush_interval_ms)
            elif isinstance(item, Chunk):
                output.add(item, clock.now_ms())
                if output.full():
                    writes.flush()
            elif isinstance(item, _Ended):
                return writes.complete()
            elif isinstance(item, _Raised):
                return _engine_raised(db, settings, attempt, item.error)
            elif isinstance(item, _FlushCalled):
                writes.flush_called()
        # Time-based flushes only once all that was taken is pending: chunks held while
        # text waited arrived before now, and belong in the flush that is due.
        writes.when_due(clock.now_ms())
        writes.tell_due()


class _Writes:
    """The attempt's fenced writes of output, each carrying the pending start if any."""

    def __init__(
        self, db: Database, attempt: Attempt, output: Output, complete: Complete,
        flushes: FlushGroup, *, running: bool,
    ) -> None:
        self._db = db
        self._attempt = attempt
        self._output = output
        self._complete = complete
        self._flushes = flushes
        self._running = running
        self._start_by_ms: int | None = None
        self._told_due_ms: int | None = None  # what `flushes` was last told
        self._call = partial(attempt.inbox.put, _FlushCalled())

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

    def when_due(self, now: int) -> None:
        if self._output.flush_due(now):
            self.flush()
        elif self._start_wait(now) == 0:
            worker_writes.start_running(self._db, self._attempt.task_id,
                                        self._attempt.claim.owner_token)
            self._running = True

    def flush(self) -> None:
        flush = self._output.take_flush()
        if flush is not None:
            self._told_due_ms = None  # the group forgets a flush it takes
            started_ms = self._db.clock.now_ms()
            # The first flush calls nobody, so that it waits for nobody either.
            self._flushes.write(worker_writes.OutputWrite(
                self._attempt.task_id, self._attempt.claim.owner_token, flush.events,
                text=flush.text, snapshot_json=flush.snapshot_json, usage=flush.usage,
                start=not self._running), call_others=not flush.first)
            self._running = True
            self._attempt.wrote(started_ms)

    def flush_called(self) -> None:
        """Flush now if the group still waits for it (a call may come late, after the
        flush it called for was written on this attempt's own time)."""
        if self._flushes.called(self._attempt.task_id):
            self.flush()

    def tell_due(self) -> None:
        """Tell the flush group when the pending text is due, if that changed."""
        due = self._output.due_at_ms()
        if due != self._told_due_ms:
            self._flushes.due(self._attempt.task_id, due, self._call)
            self._told_due_ms = due

    def ending(self) -> None:
        """No more time-based flushes: the attempt completes, stops or has ended."""
        if self._told_due_ms is not None:
            self._flushes.due(self._attempt.task_id, None, self._call)
            self._told_due_ms = None

    def complete(self) -> Outcome | None:
        self.ending()
        events, text = self._output.take_closing()
        return self._complete(completion.Completion(
            self._attempt.task_id, self._attempt.claim.owner_token, events, self._output.usage,
            text, start=not self._running))


def _stop(
    db: Database, settings: Settings, attempt: Attempt, writes: _Writes, reason: StopReason
) -> Outcome:
    claim = attempt.claim
    writes.ending()
    if reason is StopReason.LOST:
        return Outcome.LOST
    if reason is StopReason.CANCEL:
        raise CancelRequested(claim.task_id)
    if reason is StopReason.HAND_BACK:
        writes.flush()  # a resume task keeps all it made
        worker_writes.release(db, claim.task_id, claim.owner_token)
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
    if error.retryable:
        floor_ms = int((error.retry_after_seconds or 0) * 1000)
        return _retry(db, settings, attempt, error.code, error.message, floor_ms=floor_ms)
    return _fail(db, attempt, error.code, error.message)


def _retry(
    db: Database, settings: Settings, attempt: Attempt, code: str, message: str, *,
    floor_ms: int = 0,
) -> Outcome:
    """Back to the queue after the backoff, never sooner than `floor_ms` (Retry-After)."""
    delay = max(floor_ms, retry_delay_ms(attempt.claim.attempt,
                                         base_seconds=settings.backoff_base_seconds,
                                         max_seconds=settings.backoff_max_seconds))
    requeued = worker_writes.requeue(db, attempt.task_id, attempt.claim.owner_token, delay_ms=delay,
                                     code=code, message=message)
    return Outcome.REQUEUED if requeued else Outcome.DEAD_LETTERED


def _fail(db: Database, attempt: Attempt, code: str, message: str) -> Outcome:
    worker_writes.fail(db, attempt.task_id, attempt.claim.owner_token, code, message)
    return Outcome.FAILED


def _finish_cancelled(db: Database, attempt: Attempt) -> Outcome:
    try:
        worker_writes.finish_cancelled(db, attempt.task_id, attempt.claim.owner_token)
    except LeaseLost:
        return Outcome.LOST
    return Outcome.CANCELLED
