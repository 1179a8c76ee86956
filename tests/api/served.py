"""Real `taskward` processes for the end-to-end tests: `serve` (two granian workers) and
a `sweeper` running the deterministic test engine, on a random loopback port.

Every wait is bounded and every process is killed (its whole process group) when the
block ends, whatever happened inside it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.scheduler.processes import free_port

TASKWARD = str(Path(sys.executable).with_name("taskward"))
REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Service:
    base_url: str
    env: dict[str, str]
    server: subprocess.Popen[bytes] | None = None  # `running_service`'s `taskward serve`

    def cli(self, *args: str) -> str:
        """Run an operator command against the same store; its standard output."""
        done = subprocess.run([TASKWARD, *args], env=self.env, capture_output=True, text=True,
                              timeout=60, check=True)
        return done.stdout

    def cli_json(self, *args: str) -> object:
        return json.loads(self.cli(*args, "--json"))

    def admin_token(self) -> str:
        """A new admin client's bearer token (`taskward pair --admin --token`)."""
        issued = self.cli_json("pair", "--admin", "--token")
        assert isinstance(issued, dict)
        return str(issued["token"])


def service_env(database_url: str, models_dir: Path) -> dict[str, str]:
    kept = {k: v for k, v in os.environ.items() if not k.startswith("TASKWARD_")}
    return {**kept, "TASKWARD_DATABASE_URL": database_url, "TASKWARD_MODELS_DIR": str(models_dir),
            "TASKWARD_ENGINE_MODULES": "tests.engines", "TASKWARD_NODE_ID": "api-tests",
            "PYTHONPATH": str(REPO)}


@contextmanager
def process(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as output:
        child = subprocess.Popen([TASKWARD, *args], env=env, stdout=output,
                                 stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)
    try:
        yield child
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(child.pid, sig)
                child.wait(timeout=15)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue


def wait_ready(
    base_url: str, child: subprocess.Popen[bytes], log: Path, seconds: float = 30,
    probe: str = "/readyz",
) -> None:
    """Until `probe` answers 200 (`/healthz` for a store this process may not write,
    which `/readyz` never calls ready)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise RuntimeError(f"taskward serve exited:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{base_url}{probe}", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"taskward serve not ready in {seconds} s:\n{log.read_text()[-3000:]}")


@contextmanager
def running_service(
    database_url: str, workdir: Path, *, sweeper: bool = True, workers: int = 2,
    settings: dict[str, str] | None = None, probe: str = "/readyz",
) -> Iterator[Service]:
    """`taskward serve --workers 2` (and a sweeper) over a migrated store; `settings`:
    more `TASKWARD_*` variables for both; served once `probe` answers (`wait_ready`)."""
    env = {**service_env(database_url, workdir / "models"), **(settings or {})}
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    with ExitStack() as stack:
        server = stack.enter_context(process(
            ["serve", "--port", str(port), "--workers", str(workers)], env,
            workdir / "serve.log"))
        if sweeper:
            stack.enter_context(process(["sweeper"], env, workdir / "sweeper.log"))
        wait_ready(base_url, server, workdir / "serve.log", probe=probe)
        yield Service(base_url, env, server)
