"""An opt-in host-wide turn for compute steps (`TASKWARD_ENGINE_HOST_LOCK`).

Processes that name the same file take turns on it around each decode step, so their
llama.cpp threads never share the cores at once; one uncontended `flock` per step.
It is off by default: once the engine's OpenMP threads spin only briefly before they
sleep (`core.engines.llama_native`), two processes without turns did better than with
them in every run measured here (docs/benchmarks.md); it is meant for a host that runs
nothing but taskward.

`flock` locks belong to an open file description, so two loops in one process exclude
each other too, and the kernel drops a dead process's lock with its last descriptor.
"""

from __future__ import annotations

import fcntl
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class HostLock:
    """One descriptor of the lock file per loop; `turn()` holds the lock for one step.

    With no path every turn is free: a single-process deployment may opt out.
    """

    def __init__(self, path: Path | None) -> None:
        # Read-only is enough for flock, and opens a file another user created.
        self._fd = None if path is None else os.open(
            path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)

    @contextmanager
    def turn(self) -> Iterator[None]:
        if self._fd is None:
            yield
            return
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def unusable(path: Path) -> str | None:
    """Why `path` cannot be the host lock, or None: it is opened as each decode loop
    opens it (created when missing) and closed again. A process that decodes asks at
    its start, so that a lock the operator asked for is not silently off: the loop, which
    opens it only once a model is loaded, decodes without it after a warning. Anything
    but a regular file is refused unopened (a FIFO's open waits for a writer)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return "it is not a regular file"
    except FileNotFoundError:
        pass  # made by the open, when its directory exists
    except OSError as exc:
        return str(exc.strerror)
    try:
        HostLock(path).close()
    except OSError as exc:
        return str(exc.strerror)
    return None
