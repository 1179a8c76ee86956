"""Sweeper start-up: spawn -> first job, and the CPU it costs (issue 15).

Run from the repository root: `.venv/bin/python -m bench.startup [--spawns N]
[--store postgresql|sqlite] [--tasks N] [--checkout DIR ...]`. For each checkout (by
default this one; each with its own `make install`), taken in turn spawn by spawn so
that two checkouts share the machine's load, it prints:

- the interpreter's floor: CPU seconds of `python -I -S -c pass`, `python -I -c pass`
  (site-packages) and `python -c pass` in the checkout's virtualenv, up to the end of
  the code (the interpreter's exit is not counted);
- import CPU: `python -c` of what `taskward sweeper` imports before it claims (its
  command's module, the loop, the bench's plug-in engine, PostgreSQL's driver);
- spawn -> first job: `taskward sweeper` spawned against a private database already
  holding `--tasks` queued no-op tasks (the plug-in engine of `bench/noop_engine.py`),
  until its engine is first entered (the time the engine notes, as a peer's job
  function notes it), as `bench/peers.py`'s drain measures it; spawn -> first
  completion, its first `response.completed` stamp; and the process's CPU seconds
  (all threads, `/proc/PID/task/*/schedstat` sampled every millisecond) at that first
  job; and the difference of those two, spawn by spawn: the time before its first job
  the sweeper spent off a CPU (waiting on the store, or on the machine's other work),
  which a start that only waits less shortens.

Each checkout's bytecode is written first (`compileall`), as an installed package has
it: this machine's shells export PYTHONDONTWRITEBYTECODE=1, under which every spawn
would compile taskward's own sources again (~12 % of a sweeper's import instructions).
Each figure is the median of `--spawns` runs; every spawn is a fresh node and the queue
is topped up before it. Wall-clock figures depend on the machine's load: compare two
checkouts alternately, in the same minutes, and note the load average printed.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import text

from bench import noop_engine
from bench.peer_systems import fill_queue
from core.models_registry import register
from core.settings import Settings
from core.store.clients import create_client
from core.store.connect import create_db_engine
from core.store.database import Database
from infra.migrate import upgrade
from tests.databases import private_pg_database
from tests.scheduler.processes import ROOT, environment

MODEL = "noop"
# What `taskward sweeper` imports before it claims: its command, the loop, the plug-in
# engine and PostgreSQL's driver (imported when the engine is created).
SWEEPER_IMPORTS = ("from infra.cli import main; main.get_command(None, 'sweeper'); "
                   "import scheduler.loop, bench.noop_engine, "
                   "sqlalchemy.dialects.postgresql.psycopg, "
                   "psycopg")
_FIRST_COMPLETION = text("SELECT min(e.created_at) FROM task_events e JOIN tasks t ON "
                         "t.id = e.task_id WHERE t.node_id = :node "
                         "AND e.type = 'response.completed'")
_QUEUED = text("SELECT count(*) FROM tasks WHERE status = 'queued'")
PACKAGES = ("core", "scheduler", "infra", "tests")


@dataclass(frozen=True)
class Checkout:
    """A taskward checkout with its own virtualenv: what is spawned, and where."""

    root: Path

    @property
    def python(self) -> str:
        return str(self.root / ".venv" / "bin" / "python")

    @property
    def taskward(self) -> str:
        return str(self.root / ".venv" / "bin" / "taskward")

    def env(self, base: dict[str, str]) -> dict[str, str]:
        return {**base, "PYTHONPATH": str(self.root)}


@dataclass(frozen=True)
class Spawn:
    """One sweeper start: milliseconds from spawn to its first job (engine entered) and
    first completion, and its CPU seconds at that first job."""

    first_job_ms: float
    completion_ms: float
    cpu_s: float


def compile_sources(checkout: Checkout) -> None:
    subprocess.run([checkout.python, "-m", "compileall", "-q",
                    *(str(checkout.root / package) for package in PACKAGES)],
                   check=True, stdout=subprocess.DEVNULL)


def child_cpu(checkout: Checkout, code: str, *flags: str) -> float:
    """CPU seconds (user + system) a fresh interpreter has used once it ran `code`
    (its start included, its exit not: a killed sweeper never pays for one)."""
    done = subprocess.run([checkout.python, *flags, "-c", f"{code}\nimport time\n"
                           "print(time.process_time())"], cwd=checkout.root,
                          env=checkout.env(dict(os.environ)), check=True, capture_output=True,
                          text=True)
    return float(done.stdout.split()[-1])


def process_cpu(pid: int) -> float:
    """CPU seconds a live process has used so far, all its threads (schedstat: ns)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):  # a thread that just ended
            continue
    return total / 1e9


class CpuSampler(threading.Thread):
    """Samples a process's CPU every millisecond: its CPU at a moment it stamped (its
    first job) is then read off the samples, not at the later moment the bench saw the
    stamp."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self._pid = pid
        self._done = threading.Event()
        self.samples: list[tuple[float, float]] = []  # (epoch ms, CPU s)

    def run(self) -> None:
        while not self._done.wait(0.001):
            try:
                self.samples.append((time.time() * 1000, process_cpu(self._pid)))
            except FileNotFoundError:
                return

    def at(self, epoch_ms: float) -> float:
        self._done.set()
        self.join()
        return max((cpu for at, cpu in self.samples if at <= epoch_ms), default=0.0)


@dataclass(frozen=True)
class Queue:
    """A migrated private database with the no-op model registered, and the client
    whose tasks fill it."""

    settings: Settings
    client_id: str


@contextmanager
def queue(store: str, workdir: Path) -> Iterator[Queue]:
    """A migrated private database with the no-op model and a client registered."""
    models_dir = workdir / "models"
    models_dir.mkdir()
    (models_dir / "noop.bin").write_bytes(b"no-op model\n")
    with private_pg_database() if store == "postgresql" else _sqlite(workdir) as url:
        settings = Settings(database_url=url, models_dir=models_dir, node_id="bench")
        db = Database(create_db_engine(settings))
        try:
            upgrade(db.engine)
            register(db, models_dir, "noop.bin", model_id=MODEL, engine=noop_engine.NAME)
            client = create_client(db, name="bench", scopes=frozenset({"responses:create"}))
        finally:
            db.dispose()
        yield Queue(settings, client.client_id)


@contextmanager
def _sqlite(workdir: Path) -> Iterator[str]:
    yield f"sqlite:///{workdir / 'startup.db'}"


def top_up(db: Database, queued: Queue, tasks: int, spawn: str) -> None:
    """Bring the queue back to `tasks` queued no-op tasks (tagged by `spawn`)."""
    with db.read() as conn:
        missing = tasks - int(conn.execute(_QUEUED).scalar_one())
    fill_queue(db, queued.settings, queued.client_id,
               [f"{spawn}-{i}" for i in range(missing)])


def spawn_sweeper(checkout: Checkout, db: Database, env: dict[str, str], node: str,
                  logs: Path) -> Spawn:
    """Spawn one sweeper as node `node`, wait for its first completion, stop it."""
    executions = logs / f"{node}.executions"
    with (logs / f"{node}.log").open("wb") as log:
        spawned = time.time() * 1000
        child = subprocess.Popen([checkout.taskward, "sweeper"],
                                 env=checkout.env({**env, "TASKWARD_NODE_ID": node,
                                                   noop_engine.LOG_VARIABLE: str(executions)}),
                                 cwd=checkout.root, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        sampler = CpuSampler(child.pid)
        sampler.start()
        try:
            deadline = time.monotonic() + 60
            while True:
                with db.read() as conn:
                    completed = conn.execute(_FIRST_COMPLETION, {"node": node}).scalar()
                if completed is not None:
                    entered = min(at for _, at in noop_engine.read_executions(executions))
                    return Spawn(entered * 1000 - spawned, completed - spawned,
                                 sampler.at(entered * 1000))
                if child.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the sweeper completed nothing; see {log.name}")
                time.sleep(0.005)
        finally:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGTERM)
            child.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spawns", type=int, default=10)
    parser.add_argument("--tasks", type=int, default=200, help="queued tasks at each spawn")
    parser.add_argument("--store", choices=["postgresql", "sqlite"], default="postgresql")
    parser.add_argument("--checkout", type=Path, action="append",
                        help="a checkout to measure (repeatable; default: this one)")
    args = parser.parse_args()
    checkouts = [Checkout(path.resolve()) for path in args.checkout or [ROOT]]
    for checkout in checkouts:
        compile_sources(checkout)
    print(f"load average {os.getloadavg()[0]:.1f} at the start")
    floors = {"python -I -S -c pass": ("pass", "-I", "-S"),
              "python -I -c pass": ("pass", "-I"),
              "python -c pass": ("pass",),
              "python -c <the sweeper's imports>": (SWEEPER_IMPORTS,)}
    cpu: dict[tuple[Checkout, str], list[float]] = defaultdict(list)
    for _ in range(args.spawns):
        for checkout in checkouts:
            for name, (code, *flags) in floors.items():
                cpu[checkout, name].append(child_cpu(checkout, code, *flags))
    runs: dict[Checkout, list[Spawn]] = defaultdict(list)
    with tempfile.TemporaryDirectory() as workdir, queue(args.store, Path(workdir)) as queued:
        db = Database(create_db_engine(queued.settings))
        env = environment(queued.settings, worker_concurrency=16,
                          engine_modules=noop_engine.MODULE)
        try:
            for index in range(args.spawns):
                for number, checkout in enumerate(checkouts):
                    node = f"startup-{number}-{index}"
                    top_up(db, queued, args.tasks, node)
                    runs[checkout].append(spawn_sweeper(checkout, db, env, node,
                                                        Path(workdir)))
        finally:
            db.dispose()
    for checkout in checkouts:
        print(f"{checkout.root} (medians of {args.spawns}):")
        for name in floors:
            print(f"  {name:<40} CPU {statistics.median(cpu[checkout, name]) * 1000:5.0f} ms")
        spawns = runs[checkout]
        first_job = statistics.median(run.first_job_ms for run in spawns)
        print(f"  taskward sweeper ({args.store}): spawn -> first job {first_job:.0f} ms "
              f"(each: {', '.join(f'{run.first_job_ms:.0f}' for run in spawns)})")
        print(f"    -> first completion "
              f"{statistics.median(run.completion_ms for run in spawns):.0f} ms, CPU at "
              f"the first job {statistics.median(run.cpu_s for run in spawns) * 1000:.0f} ms")
        print(f"    off a CPU before the first job "
              f"{statistics.median(run.first_job_ms - run.cpu_s * 1000 for run in spawns):.0f} ms")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
