"""`core.thread_pool.DaemonThreadPool`: a `ThreadPoolExecutor`'s contract, with threads
that are named for the kernel and do not hold up the process's exit."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from core.thread_pool import DaemonThreadPool
from tests.test_thread_names import this_threads_kernel_name

REPO = Path(__file__).resolve().parents[1]


def test_pool_threads_name_themselves_after_their_python_names() -> None:
    with DaemonThreadPool(1, "taskward-runner") as pool:
        kernel = pool.submit(this_threads_kernel_name).result(10)

    assert kernel == "runner_0"


def test_a_pool_runs_at_most_its_size_at_once_and_the_rest_after() -> None:
    release = threading.Event()  # a prefix of its own: the API's pool lives in this process
    with DaemonThreadPool(3, "taskward-sized") as pool:
        blocked = [pool.submit(release.wait, 10) for _ in range(5)]
        threads = sorted(thread.name for thread in threading.enumerate()
                         if thread.name.startswith("taskward-sized_"))
        assert threads == ["taskward-sized_0", "taskward-sized_1", "taskward-sized_2"]
        assert sum(future.running() for future in blocked) <= 3
        release.set()
        assert all(future.result(10) for future in blocked)


def test_a_pools_call_returns_its_result_or_raises_its_exception() -> None:
    with DaemonThreadPool(2, "taskward-store") as pool:
        assert pool.submit(pow, 2, 10).result(10) == 1024
        failed = pool.submit(int, "not a number")
        with pytest.raises(ValueError):
            failed.result(10)


def test_shutting_down_cancels_what_no_thread_has_taken() -> None:
    started, release = threading.Event(), threading.Event()
    pool = DaemonThreadPool(1, "taskward-runner")

    def run() -> bool:
        started.set()
        return release.wait(10)

    running = pool.submit(run)
    assert started.wait(10)
    waiting = pool.submit(pow, 2, 3)
    pool.shutdown(wait=False, cancel_futures=True)
    release.set()

    assert running.result(10) is True
    assert waiting.cancelled()
    with pytest.raises(RuntimeError):
        pool.submit(pow, 2, 3)


def test_a_thread_stuck_in_a_call_does_not_hold_up_the_process_exit() -> None:
    """What a stalled store does to a pool thread: the process still exits (a
    `ThreadPoolExecutor`'s thread is joined at exit, and this one would never end)."""
    stuck = ("from core.thread_pool import DaemonThreadPool; import threading; "
             "DaemonThreadPool(1, 'taskward-store').submit(threading.Event().wait)")
    done = subprocess.run([sys.executable, "-c", stuck], cwd=REPO, timeout=30, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO)})

    assert done.returncode == 0
