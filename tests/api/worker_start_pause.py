"""An engine plug-in module (`TASKWARD_ENGINE_MODULES`) that registers no engine: in a
granian worker it pauses the worker's start at one point, so that a test can signal
the process while the worker is known to be there.

`PAUSE_WORKER_START` names the point and the directory: `factory:DIR` (the app is being
built, before granian sets the worker's handlers) or `startup:DIR` (the app's startup
hooks run, granian's handlers set). Arriving there the worker creates `DIR/paused`, then
waits for `DIR/go` (at most `MAX_PAUSE_SECONDS`). The main process imports this module
before it forks its worker; the patch is made in the child alone, at the fork.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PAUSE = "PAUSE_WORKER_START"
MAX_PAUSE_SECONDS = 60


def _pause(where: Path) -> None:
    (where / "paused").touch()
    deadline = time.monotonic() + MAX_PAUSE_SECONDS
    while not (where / "go").exists() and time.monotonic() < deadline:
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
