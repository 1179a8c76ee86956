"""`taskward serve` and sweepers over a store whose model `smol` is an upstream entry."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from tests.api.served import TASKWARD, Service, process, service_env, wait_ready
from tests.scheduler.processes import free_port

# Leases, flushes, backoff and cool-downs scaled to test time.
QUICK = {"lease_seconds": 4, "heartbeat_seconds": 1, "flush_interval_ms": 50,
         "backoff_base_seconds": 0.1, "backoff_max_seconds": 0.5, "drain_seconds": 1,
         "poll_interval_ms": 20}


def upstream_env(database_url: str, workdir: Path, **settings: object) -> dict[str, str]:
    env = service_env(database_url, workdir / "models")
    env.update({f"TASKWARD_{k.upper()}": str(v) for k, v in {**QUICK, **settings}.items()})
    return env


@contextmanager
def served(env: dict[str, str], workdir: Path, *, sweepers: int = 1) -> Iterator[Service]:
    """`taskward serve` (one worker) and `sweepers` sweeper processes."""
    port = free_port()
    with ExitStack() as stack:
        log = workdir / "serve.log"
        server = stack.enter_context(process(["serve", "--port", str(port)], env, log))
        for n in range(sweepers):
            stack.enter_context(process(["sweeper"], env, workdir / f"sweeper-{n}.log"))
        wait_ready(f"http://127.0.0.1:{port}", server, log)
        yield Service(f"http://127.0.0.1:{port}", env)


def sweeper(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """A sweeper the caller kills (whole process group) and reaps."""
    with log.open("ab") as output:
        return subprocess.Popen([TASKWARD, "sweeper"], env=env, stdout=output,
                                stderr=subprocess.STDOUT, start_new_session=True)
