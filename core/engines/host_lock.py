"""A host-wide turn for compute steps, shared by every taskward process on the host.

llama.cpp's CPU threads (an OpenMP team in this build) spin at every barrier of a
compute graph. Two processes that each run as many threads as there are cores keep
preempting each other's spinning threads, and a token that takes 12 ms alone takes
hundreds (docs/benchmarks.md, "two processes"). Taking turns per compute step instead
costs one uncontended `flock` per step and keeps the host's aggregate throughput near
one process's.

`flock` locks belong to an open file description, so two loops in one process exclude
each other too, and the kernel drops a dead process's lock with its last descriptor.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

DEFAULT_HOST_LOCK = Path(tempfile.gettempdir()) / "taskward-engine.lock"


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
