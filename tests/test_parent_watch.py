"""A process `serve` marked as its worker stops by itself once that main process is
gone (`infra.parent_watch`), also when it was gone before the worker's app was built
(kill -9 of the main process while a slow second worker was still starting left that
worker serving the port for ever), and within its stop's bound when its graceful stop
hangs. Real processes: the watch reads the process tree, which nothing can fake."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from infra.parent_watch import SERVED_BY
from tests.scheduler.processes import ROOT

# A worker's app start: watch for the parent, then serve (here: sleep). With
# `ignore_term`, its graceful stop never ends, as a hung one would not.
_WORKER = """
import signal, sys, time
from infra.parent_watch import watch_parent
if sys.argv[1] == "ignore_term":
    signal.signal(signal.SIGTERM, lambda *_: None)
watch_parent()
time.sleep(60)
"""


@contextmanager
def worker(served_by: str, mode: str = "plain") -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), SERVED_BY: served_by}
    child = subprocess.Popen([sys.executable, "-c", _WORKER, mode], env=env, cwd=ROOT,
                             stderr=subprocess.PIPE)
    try:
        yield child
    finally:
        child.kill()
        child.wait()


def gone_pid() -> int:
    finished = subprocess.Popen(["true"])
    finished.wait()
    return finished.pid


def test_a_worker_whose_main_process_was_gone_before_it_started_stops() -> None:
    with worker(f"{gone_pid()}:5") as child:
        assert child.wait(timeout=15) == -signal.SIGTERM
        assert child.stderr is not None
        assert b"is gone: this worker stops" in child.stderr.read()


def test_an_orphan_whose_stop_hangs_is_ended_within_its_bound() -> None:
    with worker(f"{gone_pid()}:1", "ignore_term") as child:
        assert child.wait(timeout=15) == -signal.SIGALRM


def test_a_process_whose_marked_server_lives_elsewhere_is_no_worker_of_it() -> None:
    """The mark is inherited by whatever a worker starts; a process the live server is
    not the parent of goes on."""
    with subprocess.Popen(["sleep", "30"]) as server, worker(f"{server.pid}:1") as child:
        time.sleep(3)
        assert child.poll() is None
        server.kill()
