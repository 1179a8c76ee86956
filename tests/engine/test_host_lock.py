"""The host-wide compute turn, across real processes."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from core.engines.base import EngineOptions, usable_cores
from core.engines.host_lock import HostLock
from core.settings import Settings

HOLDER = """
import sys
from pathlib import Path
from core.engines.host_lock import HostLock
with HostLock(Path(sys.argv[1])).turn():
    print("held", flush=True)
    sys.stdin.readline()
"""


def test_a_turn_waits_while_another_process_holds_the_host_lock(tmp_path: Path) -> None:
    path = tmp_path / "engine.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[2])
    assert holder.stdout is not None and holder.stdin is not None
    assert holder.stdout.readline().strip() == "held"
    entered = threading.Event()
    lock = HostLock(path)

    def take_turn() -> None:
        with lock.turn():
            entered.set()

    waiter = threading.Thread(target=take_turn)
    waiter.start()
    try:
        assert not entered.wait(0.5)
    finally:
        holder.stdin.write("\n")
        holder.stdin.flush()
    assert entered.wait(10)
    waiter.join()
    lock.close()
    assert holder.wait(10) == 0


def test_without_a_path_turns_are_free() -> None:
    with HostLock(None).turn(), HostLock(None).turn():
        pass


def test_engine_threads_default_to_the_usable_cores(tmp_path: Path) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path}/t.db")

    assert settings.engine_threads == usable_cores() == EngineOptions().threads
