"""Engine threads are reused, never waited for, and all accounted for at stop."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from scheduler.engine_threads import EngineRun, EngineThreads


def _wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def _recording(seen: list[threading.Thread], until: threading.Event | None = None
               ) -> Callable[[], None]:
    """An engine that notes its thread, then waits for `until` if given."""
    def run() -> None:
        seen.append(threading.current_thread())
        if until is not None:
            until.wait()
    return run


def test_a_finished_engines_thread_runs_the_next_engine() -> None:
    engines = EngineThreads(idle_limit=2)
    seen: list[threading.Thread] = []
    first = engines.start(_recording(seen), "engine-a")
    _wait_for(lambda: not first.alive)
    before = set(threading.enumerate())
    second = engines.start(_recording(seen), "engine-b")
    _wait_for(lambda: not second.alive)
    assert seen[0] is seen[1]
    assert set(threading.enumerate()) <= before  # no thread was started for it
    assert engines.stop(1.0) == []
    assert not seen[0].is_alive()


def test_a_hung_engine_keeps_its_thread_and_the_next_engine_gets_another() -> None:
    engines = EngineThreads(idle_limit=2)
    release = threading.Event()
    seen: list[threading.Thread] = []
    hung = engines.start(_recording(seen, release), "engine-hung")
    _wait_for(lambda: len(seen) == 1)
    quick = engines.start(_recording(seen), "engine-quick")
    _wait_for(lambda: not quick.alive)
    assert hung.alive and seen[1] is not seen[0]
    assert engines.stop(0.05) == ["engine-hung"]  # named, left running
    release.set()
    _wait_for(lambda: not any(t.is_alive() for t in seen))


def test_no_more_than_idle_limit_threads_stay_after_a_burst() -> None:
    engines = EngineThreads(idle_limit=1)
    release = threading.Event()
    seen: list[threading.Thread] = []
    runs: list[EngineRun] = [engines.start(_recording(seen, release), f"engine-{i}")
                             for i in range(4)]
    _wait_for(lambda: len(seen) == 4)
    release.set()
    _wait_for(lambda: not any(run.alive for run in runs))
    _wait_for(lambda: sum(t.is_alive() for t in seen) == 1)
    assert engines.stop(1.0) == []
    assert not any(t.is_alive() for t in seen)
