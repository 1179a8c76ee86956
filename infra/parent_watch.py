"""A served worker stops once the process that started it is gone.

granian runs the API in worker processes, children of `taskward serve`'s (or `run`'s)
main process, which stops them on SIGINT or SIGTERM. Killed outright (kill -9, the OOM
killer), the main process left them running as orphans: still answering on its port,
holding the port (a restart was refused, "already in use"), and in `taskward run` still
sweeping. A supervisor that kills the whole control group (systemd, a container's end)
hides this; a shell, a plain process supervisor or an OOM kill does not.

`serve` marks the processes it starts with its own pid and how long a worker may take
to stop (`mark_workers`, an environment variable the workers inherit); each worker's
app watches for its parent to go (`watch_parent`: the orphan is re-parented, or its
parent was gone before its app was built, as when the main process is killed while a
slow worker is still starting) and then stops itself as a SIGTERM stops it,
gracefully: its waits end, `taskward run`'s sweeper hands its tasks back. The main
process that would have killed a worker whose stop overruns is gone, so the orphan
sets that bound itself (`signal.alarm`: the kernel ends the process, whatever its
threads hold). An app built elsewhere (tests, `TestClient`) is not marked and watches
nothing.
"""

from __future__ import annotations

import logging
import os
import signal
import time

from core.thread_names import named_thread

log = logging.getLogger(__name__)

# Not `TASKWARD_*`: those are settings, and an unknown one is refused.
SERVED_BY = "_TASKWARD_SERVED_BY"
_WATCH_SECONDS = 1.0


def mark_workers(stop_within_seconds: int) -> None:
    """Name this process as the parent of the workers it is about to start, which stop
    within `stop_within_seconds` of their stop's beginning."""
    os.environ[SERVED_BY] = f"{os.getpid()}:{stop_within_seconds}"


def watch_parent() -> None:
    """In a worker `serve` started: stop it once its parent is gone."""
    parent, _, stop_within = os.environ.get(SERVED_BY, "").partition(":")
    if not (parent.isdigit() and stop_within.isdigit()):
        return
    if int(parent) == os.getppid() or _gone(int(parent)):
        named_thread(_watch, "parent-watch", args=(int(parent), int(stop_within))).start()


def _gone(pid: int) -> bool:
    """Whether no process `pid` is left (one that is, and is not this one's parent,
    means this process is no worker of it: a process a worker started, say)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _watch(parent: int, stop_within: int) -> None:
    while os.getppid() == parent:
        time.sleep(_WATCH_SECONDS)
    log.warning("the server's main process (pid %d) is gone: this worker stops", parent)
    signal.alarm(stop_within)  # SIGALRM's default action ends the process
    os.kill(os.getpid(), signal.SIGTERM)
