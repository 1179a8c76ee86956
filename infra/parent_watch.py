"""A served worker stops once the process that started it is gone.

granian runs the API in worker processes, children of `taskward serve`'s (or `run`'s)
main process, which stops them on SIGINT or SIGTERM. Killed outright (kill -9, the OOM
killer), the main process left them running as orphans: still answering on its port,
holding the port (a restart was refused, "already in use"), and in `taskward run` still
sweeping. A supervisor that kills the whole control group (systemd, a container's end)
hides this; a shell, a plain process supervisor or an OOM kill does not.

`serve` marks the processes it starts with its own pid (`mark_workers`, an environment
variable the workers inherit); each worker's app watches for its parent to change
(`watch_parent`: the orphan is re-parented) and then stops itself as a SIGTERM stops it,
gracefully: its waits end, `taskward run`'s sweeper hands its tasks back. An app built
elsewhere (tests, `TestClient`) is not marked and watches nothing.
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


def mark_workers() -> None:
    """Name this process as the parent of the workers it is about to start."""
    os.environ[SERVED_BY] = str(os.getpid())


def watch_parent() -> None:
    """In a worker `serve` started: stop it once its parent is gone."""
    marked = os.environ.get(SERVED_BY, "")
    if marked.isdigit() and int(marked) == os.getppid():
        named_thread(_watch, "parent-watch", args=(int(marked),)).start()


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(_WATCH_SECONDS)
    log.warning("the server's main process (pid %d) is gone: this worker stops", parent)
    os.kill(os.getpid(), signal.SIGTERM)
