"""A private PostgreSQL cluster for tests that take the store away (stop it mid-run).

Started with the server's own `initdb`/`pg_ctl` on a random loopback port in a fresh
directory, trust authentication, and removed afterwards. `initdb` refuses to run as
root, so under root the cluster belongs to the `postgres` system user (`runuser`), in a
directory that user can reach.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from core.settings import Settings
from core.store.connect import create_db_engine
from infra.migrate import upgrade
from tests.scheduler.processes import free_port

BIN = Path(os.environ.get("TASKWARD_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
_OWNER = "postgres"


@dataclass(frozen=True)
class PgCluster:
    directory: Path
    port: int

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    @property
    def conninfo(self) -> str:
        """libpq's form of `url`, for psycopg connections of the test's own."""
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def start(self) -> None:
        """Start the server (again, after `stop`) on the same port and data."""
        _run(["pg_ctl", "-D", str(self.directory / "data"), "-l",
              str(self.directory / "server.log"), "-w", "-o",
              f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 -c fsync=off",
              "start"])

    def stop(self) -> None:
        """Stop at once (`-m immediate`), as a crashed or unplugged server would."""
        _run(["pg_ctl", "-D", str(self.directory / "data"), "-m", "immediate", "-w", "stop"])

    @contextmanager
    def stalled(self) -> Iterator[None]:
        """Every process of the cluster stopped (SIGSTOP) until the block ends: the
        connections stay open and nothing answers, as with a stalled server or a
        network cut that drops packets."""
        postmaster = int((self.directory / "data" / "postmaster.pid").read_text().split()[0])
        children = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True,
                                  text=True, check=False).stdout.split()
        pids = [postmaster, *map(int, children)]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)


def _argv(command: list[str]) -> list[str]:
    argv = [str(BIN / command[0]), *command[1:]]
    return ["runuser", "-u", _OWNER, "--", *argv] if os.geteuid() == 0 else argv


def _run(command: list[str]) -> None:
    done = subprocess.run(_argv(command), capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, f"{command[0]} failed: {done.stderr[-2000:]}"


@contextmanager
def private_cluster() -> Iterator[PgCluster]:
    directory = Path(tempfile.mkdtemp(prefix="taskward-pg-"))
    if os.geteuid() == 0:
        shutil.chown(directory, _OWNER, _OWNER)
    cluster = PgCluster(directory, free_port())
    data = directory / "data"
    try:
        _run(["initdb", "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync"])
        cluster.start()
        yield cluster
    finally:
        subprocess.run(_argv(["pg_ctl", "-D", str(data), "-m", "immediate", "stop"]),
                       capture_output=True, check=False, timeout=60)
        shutil.rmtree(directory, ignore_errors=True)


@contextmanager
def migrated_cluster() -> Iterator[PgCluster]:
    """A private cluster whose `postgres` database holds taskward's schema."""
    with private_cluster() as started:
        engine = create_db_engine(Settings(database_url=started.url))
        upgrade(engine)
        engine.dispose()
        yield started
