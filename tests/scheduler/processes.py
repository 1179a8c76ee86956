"""Real `taskward` child processes for tests: environment, start, wait, kill."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from core.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
TASKWARD = [str(Path(sys.executable).with_name("taskward"))]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def environment(settings: Settings, **extra: object) -> dict[str, str]:
    """The child's environment: only this test's database, models dir and settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKWARD_")}
    env.update({
        "PYTHONPATH": str(ROOT),
        "TASKWARD_DATABASE_URL": settings.database_url,
        "TASKWARD_MODELS_DIR": str(settings.models_dir),
        "TASKWARD_NODE_ID": settings.node_id,
        "TASKWARD_ENGINE_MODULES": "tests.engines",
    })
    env.update({f"TASKWARD_{k.upper()}": str(v) for k, v in extra.items()})
    return env


def wait_until(
    predicate: Callable[[], Any], *, timeout: float, what: str, every: float = 0.02
) -> Any:
    """Poll `predicate` every `every` seconds until it returns something truthy; fail
    after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


def run_command(
    env: dict[str, str], *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TASKWARD, *args], env=env, cwd=ROOT, capture_output=True, check=False,
                          text=True, timeout=timeout)


def run_json(env: dict[str, str], *args: str, timeout: float = 60) -> Any:
    done = run_command(env, *args, "--json", timeout=timeout)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, done.stdout
    return json.loads(lines[0])


class Children:
    """Long-running `taskward` processes started by one test."""

    def __init__(self, logs: Path) -> None:
        self._logs = logs
        self._started: list[subprocess.Popen[bytes]] = []

    def start(self, env: dict[str, str], *args: str,
              wrapper: Sequence[str] = ()) -> subprocess.Popen[bytes]:
        """`taskward *args` in a session of its own; `wrapper` runs it (a tracer, say),
        and is then the process group's leader."""
        self._logs.mkdir(parents=True, exist_ok=True)
        log = (self._logs / f"{len(self._started)}-{args[0]}.log").open("wb")
        child = subprocess.Popen([*wrapper, *TASKWARD, *args], env=env, cwd=ROOT, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        self._started.append(child)
        return child

    def log_of(self, index: int) -> str:
        logs = sorted(self._logs.glob(f"{index}-*"))
        return "\n".join(p.read_text(errors="replace") for p in logs)

    def kill9(self, child: subprocess.Popen[bytes]) -> None:
        """SIGKILL the child's whole process group (granian's workers included)."""
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # the group is gone already
        child.wait(timeout=10)
        wait_until(lambda: not group_alive(child.pid), timeout=10, what="the group to die")

    def kill_all(self) -> None:
        for child in self._started:
            self.kill9(child)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
