"""A worker process's execution slots: claims into free slots, runner threads, leases.

`TASKWARD_WORKER_CONCURRENCY` slots for the local engines and, apart from them,
`TASKWARD_UPSTREAM_CONCURRENCY` slots for attempts on upstream servers (I/O, not CPU),
so neither kind waits for the other. A claim never takes more tasks than there are
free slots, since a claimed task waiting in memory would hold a lease nobody works on.
Attempts that end together complete in one transaction (`GroupCommit`), and a claim
waits a moment for slots about to free up, so short tasks cost a few transactions per
batch instead of several per task. A slot is free once its attempt's engine work is
done and its completion is handed to the group commit: the next claim then runs while
that commit is in flight (each has its own connection and thread), instead of
claim and completion taking turns. A claim's local attempts run in turn on one engine
thread, each its engine and then the stream of what it made; only an engine still
running after a few milliseconds has its stream handed to the stream thread
(`scheduler.handoff`), as an upstream attempt does from the start, and the attempts
not yet started by then get engine threads of their own. One stream thread follows
every streaming attempt (`scheduler.stream_thread`). Every thread here has an owner:
runner threads (which start upstream attempts and settle ended ones) belong to the
executor, engine threads to `EngineThreads` (reused across attempts), the lease keeper
to the pool, the hand-off watcher to `Handoffs`, the stream thread to `StreamThread`,
and `stop` ends them all.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

from core.engines.base import EngineError, ModelSource
from core.engines.upstream.routing import ROUTER
from core.error_chain import error_chain
from core.settings import Settings
from core.store import claims
from core.store.database import Database
from core.store.outage import is_row_held, outage_behind, outage_cause
from core.thread_pool import DaemonThreadPool
from scheduler.attempt import Attempt, Outcome, StopReason
from scheduler.engine_threads import EngineThreads
from scheduler.group_commit import GroupCommit, gather
from scheduler.handoff import Handoffs
from scheduler.heartbeat import LeaseKeeper

if TYPE_CHECKING:
    from core.store import completion
    from scheduler.execute import Follower, VerifyModel
    from scheduler.stream_thread import StreamThread

log = logging.getLogger(__name__)

HAND_BACK_GRACE_SECONDS = 10  # for runners to write their releases after the drain
ENGINE_JOIN_SECONDS = 5  # an engine that ignores `should_stop` is left to process exit
_HURRY_CHECK_SECONDS = 0.1  # how often a drain looks whether it was cut short
# Short tasks share transactions: a claim waits for the slots freeing with the first one,
# a completion for the attempts ending with it, at most `_GATHER_SECONDS` in all and
# never `_QUIET_SECONDS` without one more (see `gather`): long work hardly waits.
_GATHER_SECONDS = 0.02
_QUIET_SECONDS = 0.005
# A local engine still running this long after its start gets a runner of its own
# (`scheduler.handoff`). Text it made before then is flushed at most this much later
# than a runner from the start would have (`scheduler.output.FIRST_FLUSH_MS` after the
# first text), far inside the documented flush interval; an engine that ends sooner
# costs no thread hop.
_RUNNER_AFTER_SECONDS = 0.01


class Workers:
    def __init__(
        self,
        db: Database,
        settings: Settings,
        *,
        on_slot_freed: Callable[[], None] = lambda: None,
    ) -> None:
        self._db = db
        self._settings = settings
        self._on_slot_freed = on_slot_freed
        self._slots = {False: settings.worker_concurrency, True: settings.upstream_concurrency}
        self._active: dict[str, Attempt] = {}
        self._handed_over: set[str] = set()  # completion submitted: the slot is free
        self._unwritten: set[str] = set()  # ... and its group not yet written
        # Per kind (upstream or not): whether its last claim with a free slot of that
        # kind filled every one, so that more of it may be due (set by `claim`).
        self._backlog_of = dict.fromkeys(self._slots, False)
        self._freed_at = 0.0  # `time.monotonic` of the latest slot freed
        self._asked_caps = False  # whether the last claim asked the router for caps
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self.outcomes: Counter[str] = Counter()
        self.claimed = 0
        self._keeper = LeaseKeeper(db, lease_ms=int(settings.lease_seconds * 1000),
                                   heartbeat_ms=int(settings.heartbeat_seconds * 1000))
        self._completions: GroupCommit[completion.Completion] = GroupCommit(
            self._complete_group, running=self._may_submit, gather_seconds=_GATHER_SECONDS,
            quiet_seconds=_QUIET_SECONDS)
        # One thread follows every streaming attempt (started with the first: what it
        # imports waits until a claim has taken work, as `_import_attempt_modules` does).
        self._streams: StreamThread | None = None
        # A slot's runner (or engine thread) may still be writing a group of completions
        # (its own among them) while the slot's next attempt runs: twice the threads,
        # never more attempts than slots.
        threads = 2 * sum(self._slots.values())
        self._executor = DaemonThreadPool(threads, "taskward-runner")
        self._engines = EngineThreads(idle_limit=threads)
        self._handoffs = Handoffs(after_seconds=_RUNNER_AFTER_SECONDS)
        self._keeper.start()
        self._handoffs.start()

    def free_slots(self) -> int:
        """Free slots of both kinds."""
        with self._lock:
            return sum(self._free(upstream) for upstream in (False, True))

    def _free(self, upstream: bool) -> int:
        """Free slots of one kind (the lock held): an attempt whose completion was
        handed to the group commit no longer holds its slot."""
        busy = sum(1 for a in self._active.values()
                   if a.claim.upstream == upstream and a.task_id not in self._handed_over)
        return self._slots[upstream] - busy

    def _executing(self) -> int:
        """Attempts still doing their work (the lock held): what occupies a slot."""
        return len(self._active) - len(self._handed_over)

    def _may_submit(self) -> int:
        """For the group commit: attempts that may still submit or wait to be written."""
        with self._lock:
            return self._executing() + len(self._unwritten)

    def _submit_completion(self, item: completion.Completion) -> None:
        """Hand a finished generation to the group commit, which settles its attempt
        once written (the submitting thread goes on at once); its slot is free from now."""
        with self._lock:
            attempt = self._active[item.task_id]
            self._handed_over.add(item.task_id)
            self._unwritten.add(item.task_id)
            self._slot_freed()
        self._on_slot_freed()
        self._completions.submit(item, partial(self._written, attempt, item))

    def _written(self, attempt: Attempt, item: completion.Completion,
                 failure: BaseException | None) -> None:
        """Settle `attempt` once its completion's group is written; one that a row held
        by another transaction refused (`is_row_held`) is parked on the stream thread
        instead, tried again apart until it lands or the attempt must stop, while the
        completions of the others go on."""
        from core.store.completion import complete_apart
        from scheduler.execute import written

        if isinstance(failure, Exception) and is_row_held(failure):
            self._stream_thread().park(attempt, partial(complete_apart, self._db, item),
                                       partial(written, self._db, attempt), failure)
            return
        self._settle(attempt, lambda: written(self._db, attempt, failure))

    def _complete_group(
        self, items: Sequence[completion.Completion]
    ) -> Sequence[BaseException | None]:
        from core.store.completion import complete_all

        try:
            return complete_all(self._db, items)
        finally:  # before the next group's leader counts who may still submit
            with self._lock:
                self._unwritten.difference_update(item.task_id for item in items)

    def busy(self) -> bool:
        with self._lock:
            return bool(self._active)

    def caught_up(self) -> bool:
        """Whether the last claim of each kind found fewer due tasks than free slots,
        i.e. took all that was due then. A claim in which a kind had no free slot says
        nothing of that kind."""
        with self._lock:
            return not self._backlog()

    def _backlog(self) -> bool:
        """Whether more work of some kind may be due than its last claim took (the lock
        held)."""
        return any(self._backlog_of.values())

    def gather_slots(self) -> None:
        """Before a claim, when the last one found more due work than free slots: while
        attempts run, wait for more slots to free up, at most `_GATHER_SECONDS` in all
        and `_QUIET_SECONDS` without one freeing.

        Attempts that end together (one group commit) free their slots one by one; a
        claim at the first would take one task, and the next claim the rest. Waiting a
        moment makes it one claim, while a slot freed among long-running attempts is
        refilled after a few milliseconds. Without a backlog nothing waits: a new task
        is claimed at once.
        """
        with self._lock:
            gather(self._idle, lambda: self._freed_at,
                   lambda: not (self._backlog() and self._executing()),
                   gather_seconds=_GATHER_SECONDS, quiet_seconds=_QUIET_SECONDS)

    def claim(self) -> int:
        """Claim due work into the free slots and start it; returns how many started."""
        with self._lock:
            local, upstream = self._free(False), self._free(True)
        self._asked_caps = upstream > 0
        if local <= 0 and upstream <= 0:
            return 0
        leased_at = self._db.clock.now_ms()  # no later than the lease's start
        # Tasks of a model whose URLs cool down here, beyond one probe's, would only be
        # handed back (docs/upstream.md).
        taken = claims.claim(self._db, limit=local, upstream_limit=upstream,
                             lease_ms=int(self._settings.lease_seconds * 1000),
                             node_id=self._settings.node_id,
                             caps=ROUTER.claim_caps() if self._asked_caps else {})
        if self._asked_caps:  # a model offered a probe but not taken passes it on at once
            ROUTER.claim_took({c.model for c in taken})
        with self._lock:
            # More may be due when a kind filled all its free slots: worth gathering slots.
            # A kind with no free slot was not asked: what its last claim found stands (a
            # claim for upstream slots alone, all local ones busy, said the local backlog
            # was gone, and released the start's maintenance pass in the middle of a drain).
            for kind, free in ((False, local), (True, upstream)):
                if free > 0:
                    self._backlog_of[kind] = sum(1 for c in taken if c.upstream == kind) == free
        if not taken:
            return 0
        _import_attempt_modules()
        from core.models_registry import verified_entry

        timeout_ms = int(self._settings.task_timeout_seconds * 1000)
        entries = {c.model: c.model_entry for c in taken}  # read by the claim
        verify = verified_once(lambda model_id: verified_entry(self._settings.models_dir,
                                                               entries[model_id]))
        in_turn: deque[Attempt] = deque()
        for claim in taken:
            attempt = Attempt(claim, clock=self._db.clock, timeout_ms=timeout_ms,
                              lease_ms=int(self._settings.lease_seconds * 1000),
                              leased_at_ms=leased_at)
            with self._lock:
                self._active[claim.task_id] = attempt
                self.claimed += 1
            self._keeper.hold(attempt)
            if claim.upstream:  # its engine waits on the network: a runner from the start
                self._executor.submit(self._run, attempt, verify)
            else:
                in_turn.append(attempt)
        if in_turn:
            self._engines.start(partial(self._run_in_turn, in_turn, verify),
                                f"engine-{in_turn[0].task_id}")
        return len(taken)

    def idle_wait(self, longest: float) -> float:
        """How long the claimer may sleep with nothing announced: `longest`, or less when
        the last claim held a model's tasks back for a cool-down here: until it ends, or
        not at all when a probe it offered passed to the next model sharing the URL
        (`Router.caps_lift_in_seconds`), as no announcement or freed slot marks that."""
        lift = ROUTER.caps_lift_in_seconds() if self._asked_caps else None
        return longest if lift is None else min(longest, lift)

    def _run_in_turn(self, batch: deque[Attempt], verify: VerifyModel) -> None:
        """A claim's local attempts, one after another on one engine thread: waking a
        thread per attempt cost a wake-up each and the GIL's hand-offs among the 16
        threads a claim woke together (issue 15). Whatever has not started
        `_RUNNER_AFTER_SECONDS` after the batch did goes to engine threads of its own
        (`scheduler.handoff`), so no attempt starts later than that behind another,
        whether that one runs long, waits on the store or hangs."""
        lock = threading.Lock()

        def scatter() -> None:
            with lock:
                rest = list(batch)
                batch.clear()
            for attempt in rest:
                self._engines.start(partial(self._run_in_turn, deque([attempt]), verify),
                                    f"engine-{attempt.task_id}")

        kept = self._handoffs.watch(scatter)
        while True:
            with lock:
                if not batch:
                    break
                attempt = batch.popleft()
            self._run_here(attempt, verify)
        kept()
        self._completions.lead()  # the batch's completions, unless someone writes them

    def _run(self, attempt: Attempt, verify: VerifyModel) -> None:
        """An upstream attempt: started here, its engine on a thread of its own, its
        stream followed by the stream thread."""
        from scheduler.execute import execute

        self._settle(attempt, lambda: execute(self._db, self._settings, attempt, verify=verify,
                                              complete=self._submit_completion,
                                              engines=self._engines, follow=self._follow))

    def _follow(self, follower: Follower) -> None:
        """Hand an attempt's stream to the stream thread, which settles it (`_streamed`)."""
        self._stream_thread().follow(follower)

    def _stream_thread(self) -> StreamThread:
        """The stream thread, started with its first attempt (streamed or parked)."""
        with self._lock:
            if self._streams is None:
                from scheduler.stream_thread import StreamThread, join_window_ms

                self._streams = StreamThread(
                    self._db, join_ms=join_window_ms(self._settings.flush_interval_ms),
                    done=self._streamed)
                self._streams.start()
            return self._streams

    def _streamed(self, attempt: Attempt, result: Callable[[], Outcome | None]) -> None:
        """The stream thread is done with `attempt`; settling it may write (its
        completion's group, the upstream reports), so a runner thread does it."""
        self._executor.submit(self._settle, attempt, result, lead=True)

    def _run_here(self, attempt: Attempt, verify: VerifyModel) -> None:
        """An engine thread's attempt, engine and stream, unless the engine runs long
        enough to be handed a runner (`scheduler.handoff`), which then settles it."""
        from scheduler.execute import execute_here

        def watch(stream: Callable[[], Outcome | None]) -> Callable[[], bool]:
            def hand_over() -> None:
                self._settle(attempt, stream)
                # The attempts this thread finished before this one wait in the group
                # commit for the end of their batch: this engine is no short one, and
                # behind it they showed `loading` (uncancellable, lost to a crash)
                # for as long as it ran. A runner writes them now.
                self._executor.submit(self._completions.lead)

            return self._handoffs.watch(hand_over)

        self._settle(attempt, lambda: execute_here(self._db, self._settings, attempt,
                                                   verify=verify,
                                                   complete=self._submit_completion,
                                                   watch=watch, follow=self._follow))

    def _settle(self, attempt: Attempt, run: Callable[[], Outcome | None], *,
                lead: bool = False) -> None:
        """Run the attempt (or the rest of it) and free its slot with its outcome; None:
        the rest was handed to a runner, or the completion to the group commit, which
        settles it (`lead`: write it then, unless someone else writes)."""
        try:
            outcome = run()
        except Exception as exc:  # a database outage: the lease will expire and policy applies
            _log_abandoned(attempt.task_id, exc)
            outcome = Outcome.LOST
        if outcome is None:
            if lead:
                self._completions.lead()
            return
        self._keeper.drop(attempt)
        _record_upstream_reports(self._db)
        with self._lock:
            del self._active[attempt.task_id]
            # A slot freed at hand-over was news then: now only the last attempt's end
            # (`wait_idle`, `busy`) or the end of one never handed over is.
            news = attempt.task_id not in self._handed_over or not self._active
            self._handed_over.discard(attempt.task_id)
            self._unwritten.discard(attempt.task_id)
            self.outcomes[outcome] += 1
            if news:
                self._slot_freed()
        if news:
            self._on_slot_freed()

    def _slot_freed(self) -> None:
        """Stamp a freed slot (the lock held) for `gather_slots`, which needs waking only
        once nothing executes (or for `wait_idle`, once nothing is active at all)."""
        self._freed_at = time.monotonic()
        if not self._executing():
            self._idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no attempt runs; False when `timeout` passed first."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._active:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
            return True

    def stop(self, *, drain_seconds: float, hurry: threading.Event | None = None) -> None:
        """Graceful stop (the caller has stopped claiming): let running attempts finish
        for `drain_seconds`, or until `hurry` is set (an operator's second Ctrl-C), then
        hand the rest back (attempt refunded, snapshot kept)."""
        idle = self._drain(drain_seconds, hurry)
        if not idle:
            with self._lock:
                left = list(self._active.values())
            log.info("handing back %d unfinished task(s)", len(left))
            for attempt in left:
                attempt.raise_flag(StopReason.HAND_BACK)
            idle = self.wait_idle(HAND_BACK_GRACE_SECONDS)
            if not idle:
                log.warning("runners still busy after the hand-back; their leases will expire")
        # Idle runner threads end at once and are joined; a runner stuck in a database
        # call is left to process exit rather than hanging the stop. No attempt is handed
        # to a runner from here on.
        self._handoffs.stop()
        if self._streams is not None:
            self._streams.stop(ENGINE_JOIN_SECONDS if idle else 0)
        self._executor.shutdown(wait=idle, cancel_futures=True)
        if not self._keeper.stop(ENGINE_JOIN_SECONDS):
            log.warning("the lease keeper is still waiting on the store; its leases will expire")
        for name in self._engines.stop(ENGINE_JOIN_SECONDS):
            log.warning("engine thread %s ignores should_stop; left to process exit", name)

    def _drain(self, seconds: float, hurry: threading.Event | None) -> bool:
        """`wait_idle(seconds)`, cut short once `hurry` is set. A signal handler sets
        `hurry` and must not take this object's lock (the signal may land while its own
        thread holds it), so the drain looks at the event every `_HURRY_CHECK_SECONDS`
        instead of being woken by it."""
        if hurry is None:
            return self.wait_idle(seconds)
        deadline = time.monotonic() + seconds
        while not hurry.is_set():
            left = deadline - time.monotonic()
            if self.wait_idle(min(left, _HURRY_CHECK_SECONDS)):
                return True
            if left <= _HURRY_CHECK_SECONDS:
                return False
        log.info("stop signalled again: ending the drain now")
        return self.wait_idle(0)


def _record_upstream_reports(db: Database) -> None:
    """Write what this process's attempts saw of upstreams (errors, cool-downs) for
    /metrics; lost, and logged, when the store is unreachable: they are monitoring."""
    reports = ROUTER.take_reports()
    if not reports:
        return
    from core.store import upstream_health

    try:
        upstream_health.record(db, reports)
    except Exception as exc:  # never let monitoring break a slot
        log.warning("upstream reports not stored (%s)", type(exc).__name__)


def _import_attempt_modules() -> None:
    """Import what an attempt runs with (`scheduler.execute`: the stored request's
    decoder, the engines' calls, completion; the model check; the lease keeper's cancel
    query) once a claim has taken work, before its attempts start: a sweeper then claims
    before paying for them (issue 15). Not from the attempts' threads: an engine thread
    waiting on another's import looked stalled to the hand-off watcher, which then spread
    the batch over a thread per attempt."""
    for name in ("scheduler.execute", "core.store.tasks"):
        importlib.import_module(name)


def verified_once(verify: VerifyModel) -> VerifyModel:
    """`verify`, run at most once per model id: the attempts of one claim batch share
    the answer (an error included), saving a stat and a digest lookup per task."""
    answers: dict[str, tuple[str, ModelSource] | EngineError] = {}
    lock = threading.Lock()

    def check(model_id: str) -> tuple[str, ModelSource]:
        with lock:
            if model_id not in answers:
                try:
                    answers[model_id] = verify(model_id)
                except EngineError as exc:
                    answers[model_id] = exc
            answer = answers[model_id]
        if isinstance(answer, EngineError):
            raise EngineError(answer.code, answer.message, retryable=answer.retryable)
        return answer

    return check


def _log_abandoned(task_id: str, exc: Exception) -> None:
    """An attempt given up on: its lease runs out and its restart policy applies. A
    store outage (the error itself, or what a group write's failure was raised from) is
    one line per attempt, as every attempt in flight meets it at once and its traceback
    says nothing more; so is a row another transaction held past the bound (the store
    is fine: the line names the hold, which an operator looks for); any other error
    keeps its traceback."""
    held = next((seen for seen in error_chain(exc, handled=False) if is_row_held(seen)),
                None)
    if held is not None:
        log.error("task %s: attempt given up, a row of it is held by another transaction "
                  "(%s); its lease runs out and its restart policy applies", task_id,
                  outage_cause(getattr(held, "orig", held)))
        return
    outage = outage_behind(exc)
    if outage is None:
        log.exception("task %s: attempt abandoned", task_id)
    else:
        log.error("task %s: attempt abandoned, the store is unavailable (%s); its lease "
                  "runs out and its restart policy applies", task_id, type(outage).__name__)
