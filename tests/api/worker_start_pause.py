"""An engine plug-in module (`TASKWARD_ENGINE_MODULES`) that registers no engine: in a
granian worker it pauses the worker's start at one point, so that a test can signal
the process while the worker is known to be there.

`PAUSE_WORKER_START` names the point and the directory: `factory:DIR` (the app is being
built, before granian sets the worker's handlers) or `startup:DIR` (the app's startup
hooks run, granian's handlers set). Arriving there the worker creates `DIR/paused`, then
waits for `DIR/go` and for the stop signal to be held for it (at most
`MAX_PAUSE_SECONDS` in all). The main process imports this module before it forks its
worker; the patch is made in the child alone, at the fork.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PAUSE = "PAUSE_WORKER_START"
MAX_PAUSE_SECONDS = 60


def _pause(where: Path) -> None:
    """Wait for `go`, then for the stop signal to have reached this worker: one sent to
    the main process alone reaches it only once that process passes it on, which may
    be after `go` (the worker then started before it came, and drains as documented)."""
    (where / "paused").touch()
    deadline = time.monotonic() + MAX_PAUSE_SECONDS
    while not (where / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    while not signal.sigpending() & {signal.SIGTERM, signal.SIGINT} and (
            time.monotonic() < deadline):
        time.sleep(0.01)


def _pausing(call: Callable[..., Any], where: Path, *, after: bool) -> Callable[..., Any]:
    def paused(*args: Any) -> Any:
        if not after:
            _pause(where)
        done = call(*args)
        if after:
            _pause(where)
        return done
    return paused


def _in_the_worker() -> None:
    point, _, directory = os.environ.get(PAUSE, "").partition(":")
    import infra.app
    import infra.runtime

    if point == "factory":  # the factory's first call
        setattr(infra.runtime, "load_settings",
                _pausing(infra.runtime.load_settings, Path(directory), after=False))  # type: ignore[attr-defined]
    elif point == "startup":  # once the first startup hook has set its handler
        infra.app._end_waits_when_told_to_stop = _pausing(
            infra.app._end_waits_when_told_to_stop, Path(directory), after=True)


if os.environ.get(PAUSE):
    os.register_at_fork(after_in_child=_in_the_worker)
