"""The settings and sweepers of tests over a store whose model `smol` is an upstream entry."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.api.served import TASKWARD, service_env

# Leases, flushes, backoff and cool-downs scaled to test time.
QUICK = {"lease_seconds": 4, "heartbeat_seconds": 1, "flush_interval_ms": 50,
         "backoff_base_seconds": 0.1, "backoff_max_seconds": 0.5, "drain_seconds": 1,
         "poll_interval_ms": 20}


def quick_settings(**settings: object) -> dict[str, str]:
    """`QUICK`, with `settings` over it, as `TASKWARD_*` variables."""
    return {f"TASKWARD_{k.upper()}": str(v) for k, v in {**QUICK, **settings}.items()}


def upstream_env(database_url: str, workdir: Path, **settings: object) -> dict[str, str]:
    return {**service_env(database_url, workdir / "models"), **quick_settings(**settings)}


def sweeper(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """A sweeper the caller kills (whole process group) and reaps."""
    with log.open("ab") as output:
        return subprocess.Popen([TASKWARD, "sweeper"], env=env, stdout=output,
                                stderr=subprocess.STDOUT, start_new_session=True)
