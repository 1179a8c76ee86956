"""What a stop signal does in a process granian serves, beside granian's own handling.

granian's worker hears SIGTERM and SIGINT through its event loop's wake-up descriptor
and begins its shutdown, but it lets the worker end only once every open connection
has ended, and runs the app's shutdown hooks only then. What must happen at the signal
itself (the API's waits ending; in `taskward run`, a second Ctrl-C cutting the drain
short) is added here as a Python handler that runs, then calls the one set before it.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterable
from functools import partial
from types import FrameType
from typing import Any

Handler = Callable[[int, FrameType | None], Any]


def also_on(signums: Iterable[signal.Signals], call: Callable[[], object]) -> None:
    """From now on each of `signums` also calls `call()`: on this thread, between two
    bytecodes, so `call` must take no lock this thread may hold. Only on the process's
    main thread (an app in a test client's thread is left alone), and only beside a
    handler the server set."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in signums:
        servers = signal.getsignal(signum)
        if callable(servers):
            signal.signal(signum, partial(_both, call, servers))


def _both(call: Callable[[], object], servers: Handler, signum: int,
          frame: FrameType | None) -> None:
    call()
    servers(signum, frame)
