"""How many connections a real `taskward serve` process holds, and what it needs for them.

granian's default cap (1024 connections per process) let eleven clients, each within
its 100 streams, leave `/healthz` unanswered. The cap is `TASKWARD_HTTP_MAX_CONNECTIONS`
per API process, and the process raises its own soft open-files limit to fit it. Not a
store test: one SQLite file is enough.
"""

from __future__ import annotations

import resource
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx

from tests.api.served import REPO, process, service_env, wait_ready
from tests.databases import copy_sqlite
from tests.scheduler.processes import free_port

PAST_GRANIANS_DEFAULT = 2000  # connections: past 1024, within the default cap of 4096
USUAL_SOFT_LIMIT = 1024  # open files: a login shell's, a systemd unit's
SMALL_CAP = 128  # the setting's least


@contextmanager
def soft_open_files(limit: int) -> Iterator[None]:
    """This process's soft open-files limit set to `limit` (children started meanwhile
    inherit it), restored afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@contextmanager
def served(workdir: Path, sqlite_template: Path, soft_limit: int,
           settings: dict[str, str] | None = None) -> Iterator[str]:
    """`taskward serve` (one worker) started under `soft_limit` open files; its URL."""
    env = {**service_env(copy_sqlite(sqlite_template, workdir / "taskward.db"),
                         workdir / "models"), **(settings or {})}
    port, log = free_port(), workdir / "serve.log"
    with ExitStack() as stack:
        with soft_open_files(soft_limit):
            child = stack.enter_context(process(["serve", "--port", str(port)], env, log))
        base_url = f"http://127.0.0.1:{port}"
        wait_ready(base_url, child, log)
        yield base_url


@contextmanager
def held_connections(base_url: str, count: int) -> Iterator[None]:
    """`count` open connections that send nothing (each held until the block ends)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with soft_open_files(max(soft, min(hard, count + 1024))), ExitStack() as stack:
        port = int(base_url.rsplit(":", 1)[1])
        for _ in range(count):
            stack.enter_context(socket.create_connection(("127.0.0.1", port)))
        yield


def probe(base_url: str) -> int | None:
    """`/healthz`'s status, or None when it is not answered within 3 s."""
    try:
        return httpx.get(f"{base_url}/healthz", timeout=3).status_code
    except httpx.TimeoutException:
        return None


def test_probes_are_answered_past_granians_default_of_1024_connections(
        tmp_path: Path, sqlite_template: Path) -> None:
    """Started under the usual soft limit of 1024 open files, which the process raises."""
    with served(tmp_path, sqlite_template, USUAL_SOFT_LIMIT) as base_url, \
            held_connections(base_url, PAST_GRANIANS_DEFAULT):
        assert probe(base_url) == 200


def test_a_process_holds_no_more_connections_than_the_setting(
        tmp_path: Path, sqlite_template: Path) -> None:
    settings = {"TASKWARD_HTTP_MAX_CONNECTIONS": str(SMALL_CAP)}
    with served(tmp_path, sqlite_template, USUAL_SOFT_LIMIT, settings) as base_url:
        with held_connections(base_url, SMALL_CAP):
            at_the_cap = probe(base_url)
        assert (at_the_cap, probe(base_url)) == (None, 200)


def test_a_hard_limit_too_low_for_the_cap_lowers_it_with_a_warning() -> None:
    """The soft limit is raised to the hard one; the cap leaves room for other files."""
    script = (
        "import resource\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, 2048))\n"
        "from infra.server import connections_within_open_files\n"
        "print(connections_within_open_files(4096), "
        "resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=REPO, timeout=60, check=True)
    assert done.stdout.split() == ["1024", "2048"]
    assert "TASKWARD_HTTP_MAX_CONNECTIONS" in done.stderr and "2048" in done.stderr

