"""taskward's threads, named for the kernel as well as for Python.

Python before 3.14 names a thread for itself only. The kernel, and with it `top -H`,
`ps -L`, `/proc/PID/task/*/comm` and any profiler outside the process, sees every
thread of a taskward process under the process's own name. So each long-lived thread
gives itself its kernel name as it starts. An operator can then see which one is busy
(`top -H -p PID`), and `bench.upstream_cpu` can say where a streamed token's CPU goes.

The kernel name is the Python name without the `taskward-` prefix (the process is
already called that), cut to the kernel's 15 bytes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

_PREFIX = "taskward-"
_KERNEL_NAME_BYTES = 15  # the kernel keeps 16 with the terminating NUL


def named_thread(
    target: Callable[..., object], name: str, *, args: tuple[Any, ...] = (),
    kernel_name: str | None = None,
) -> threading.Thread:
    """An unstarted daemon thread called `name` that runs `target(*args)` after naming
    itself for the kernel (`kernel_name`, else derived from `name`)."""

    def run() -> None:
        name_for_kernel(kernel_name or name)
        target(*args)

    return threading.Thread(target=run, name=name, daemon=True)


def name_for_kernel(name: str) -> None:
    """Give the calling thread `name` as its kernel name; nothing where the kernel has
    no `/proc/thread-self` (not Linux)."""
    if name.startswith(_PREFIX):
        name = name[len(_PREFIX):]
    short = name.encode()[:_KERNEL_NAME_BYTES].decode(errors="ignore")
    try:
        with open("/proc/thread-self/comm", "w") as comm:
            comm.write(short)
    except OSError:
        return
