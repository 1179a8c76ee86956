"""What SIGTERM and SIGINT do in taskward's processes.

`taskward sweeper` and `taskward sweep` own their signals (`stop_then_hurry`): the
first asks for a graceful stop, a second cuts its drain short.

In a process granian serves (`serve`, `run`), granian's worker hears them through its
event loop's wake-up descriptor and begins its shutdown, but it lets the worker end
only once every open connection has ended, and runs the app's shutdown hooks only then:
never, when a client leaves its answers unread (its connection does not end; granian
kills the worker in the end). What must happen at the signal itself (the API's waits
ending; in `taskward run`, the sweeper's drain and hand-back, a second Ctrl-C cutting
that drain short: `GracefulStop`) is added by `also_on` as a Python handler that runs,
then calls the one set before it.

A granian worker is deaf to a stop while it starts: its app is built before granian
sets the worker's handlers (the main process's, inherited at the fork, are of no use
in it), its event loop hears a signal only while it runs, and granian's handler wedges
the worker (its main thread holding the GIL for ever) when it runs twice before the
worker serves. So a worker starts with both signals held in the kernel
(`hold_stop_signals`, at the fork) and lets them in once every handler of its app is in
place (`let_stop_signals_in`, the app's last startup hook): one that came meanwhile is
delivered then, once, and later ones are held for good, the stop being under way.

A Python handler runs on the main thread between two bytecodes, so it must not take a
lock that thread may hold: the handlers here only set events that the main thread never
waits on (`wait_for` polls instead) or call `call_soon_threadsafe`, which takes none.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from types import FrameType
from typing import Any

Handler = Callable[[int, FrameType | None], Any]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

# How often `wait_for` looks whether a signal has set its event.
_STOP_CHECK_SECONDS = 0.2


@contextmanager
def stop_then_hurry(stop: threading.Event, hurry: threading.Event) -> Iterator[None]:
    """Within the block SIGTERM and SIGINT set `stop` (a graceful stop) instead of
    killing mid-write; a second one sets `hurry` (hand back at once instead of waiting
    out the drain), as an operator who presses Ctrl-C twice expects. The handlers set
    before are back afterwards."""

    def signalled(_signum: int, _frame: FrameType | None) -> None:
        (hurry if stop.is_set() else stop).set()

    previous = {signum: signal.signal(signum, signalled)
                for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def wait_for(stop: threading.Event) -> None:
    """Return once `stop` is set, looking every `_STOP_CHECK_SECONDS`. Not
    `stop.wait()`: a handler landing while `Event.wait` held the event's lock would
    deadlock on its `set`, as the lock is not reentrant (a scratch loop of `wait` under
    a stream of signals hung within seconds)."""
    while not stop.is_set():
        time.sleep(_STOP_CHECK_SECONDS)


def hold_stop_signals() -> None:
    """From now until `let_stop_signals_in`, a SIGTERM or SIGINT to this process waits
    in the kernel (one of each at most) instead of reaching a handler; so does one to
    any thread this thread starts meanwhile, which inherits the mask."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


def let_stop_signals_in() -> bool:
    """End `hold_stop_signals`; whether a stop signal came while they were held. If one
    did, it reaches the handlers now as one SIGTERM (a SIGINT and a SIGTERM together,
    as a Ctrl-C to the group and granian's main process passing it on send, would run
    granian's handler twice), and stop signals stay held: the stop is under way, and a
    second one could only wedge granian. Without a hold this returns False and changes
    nothing (and off the main thread, whose mask is not the one held, it does nothing)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    came = False
    while signal.sigtimedwait(STOP_SIGNALS, 0) is not None:
        came = True
    if came:
        signal.raise_signal(signal.SIGTERM)  # held too: delivered at the unblocking
    # Pending signals are delivered, and their Python handlers run, before this returns.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    if came:
        hold_stop_signals()
    return came


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


def on_loop(call: Callable[[], object]) -> Callable[[], None]:
    """`call`, handed from a signal handler to the running event loop (`also_on`'s
    `call`); nothing once that loop has closed, as it has when a signal comes late in
    the worker's exit."""
    loop = asyncio.get_running_loop()

    def hand_over() -> None:
        try:
            loop.call_soon_threadsafe(call)
        except RuntimeError:  # the loop is closed: nothing of it is left to stop
            pass
    return hand_over


def _both(call: Callable[[], object], servers: Handler, signum: int,
          frame: FrameType | None) -> None:
    try:
        call()
    finally:  # the server's own handler runs whatever ours did
        servers(signum, frame)


class GracefulStop:
    """A graceful stop that blocks (`stop(hurry)`: a sweeper's drain and hand-back),
    begun in a thread at the first SIGTERM or SIGINT once `arm`ed, whatever the
    server's connections do, and awaited by the app's shutdown hook (`finish`).

    From its beginning on, a SIGINT sets `hurry`, the operator's second Ctrl-C; a
    SIGTERM never does: the first Ctrl-C reaches granian's main process too, which
    passes it on to the worker as a SIGTERM of its own, and systemd sends one to the
    whole group."""

    def __init__(self, stop: Callable[[threading.Event], None]) -> None:
        self._stop = stop
        self._running: asyncio.Future[None] | None = None

    def arm(self) -> None:
        """From now on the first stop signal begins the stop; called on the event loop
        that `finish` will run on (a signal handler may only hand it the call)."""
        also_on((signal.SIGTERM, signal.SIGINT), on_loop(self._begin))

    async def finish(self) -> None:
        """Return once the stop is over, beginning it if no signal has (an app that
        was not `arm`ed, or a shutdown no signal asked for)."""
        self._begin()
        assert self._running is not None
        await self._running

    def _begin(self) -> None:
        if self._running is not None:
            return
        hurry = threading.Event()
        also_on((signal.SIGINT,), hurry.set)
        # Off the event loop: the drain blocks for up to TASKWARD_DRAIN_SECONDS while
        # the API goes on answering on the connections still open.
        self._running = asyncio.ensure_future(asyncio.to_thread(self._stop, hurry))
