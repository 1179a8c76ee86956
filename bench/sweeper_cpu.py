"""CPU seconds per no-op task of real `taskward sweeper` processes draining a backlog.

Run from the repository root: `.venv/bin/python -m bench.sweeper_cpu [--tasks N]`.

The sweepers (2 × 16 slots by default, as in `bench/peers.py`'s drain) are started
and left to finish their start-up; their CPU time (user + system, all threads, from
/proc/<pid>/stat) is read, N no-op tasks are committed in one transaction, and the
CPU is read again once every task has completed. Start-up and idle polling are thus
left out: the figure is the work per task, which, unlike the wall-clock rate beside
it, hardly depends on what else runs on this shared machine. On PostgreSQL the CPU of
the server processes serving the bench's private database (found by its name in their
/proc cmdline) is read the same way: the sweepers and the server share the 2 cores.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import text

from bench.peer_systems import processes
from bench.pipeline_probe import summary
from bench.throughput import TASKWARD, completed, enqueue_at_once, store
from core.settings import Settings
from core.store.connect import create_db_engine
from core.store.database import Database
from tests.scheduler.processes import environment, wait_until

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def server_cpu(database: str) -> dict[int, float]:
    """CPU of each PostgreSQL backend connected to `database`, by pid."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().decode(errors="replace")
                if argv.startswith("postgres: ") and f" {database} " in argv:
                    found[int(entry.name)] = cpu_seconds(int(entry.name))
            except OSError:  # it ended meanwhile
                continue
    return found


def measure(settings: Settings, sweepers: int, count: int, slots: int,
            logs: Path, *, analyze: bool = False,
            probes: list[Path] | None = None) -> tuple[float, float, float]:
    """(CPU ms per task of all sweepers together, of their database backends (0 on
    SQLite), tasks per second). `probes`: one file per sweeper, run as
    `bench.pipeline_probe`, for its record of the pipeline."""
    env = environment(settings, worker_concurrency=slots)
    commands = [([TASKWARD, "sweeper"] if probes is None else
                 [sys.executable, "-m", "bench.pipeline_probe"],
                 {**env, "TASKWARD_NODE_ID": f"cpu-{i}",
                  **({} if probes is None else {"BENCH_PROBE_OUT": str(probes[i])})})
                for i in range(sweepers)]
    db = Database(create_db_engine(settings))
    try:
        with processes(commands, logs, "sweeper") as children:
            wait_until(lambda: len([p for p in logs.glob("sweeper-*.log")
                                    if "sweeper started" in p.read_text()]) == sweepers,
                       timeout=60, what="sweepers up")
            time.sleep(0.5)  # the start-up's last steps after the log line
            name = db.engine.url.database or ""
            with db.read() as conn:  # the bench's own backend (enqueue, polling) is left out
                own = None if settings.is_sqlite else conn.execute(
                    text("SELECT pg_backend_pid()")).scalar()
            before = sum(cpu_seconds(child.process.pid) for child in children)
            served = {} if settings.is_sqlite else server_cpu(name)
            start = enqueue_at_once(db, count, analyze=analyze)
            wait_until(lambda: completed(db) >= count, timeout=900, what="all completed")
            wall = time.perf_counter() - start
            after = sum(cpu_seconds(child.process.pid) for child in children)
            serving = {} if settings.is_sqlite else server_cpu(name)
        server = sum(cpu - served.get(pid, 0.0) for pid, cpu in serving.items() if pid != own)
        return 1000 * (after - before) / count, 1000 * server / count, count / wall
    finally:
        db.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--sweepers", type=int, default=2)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--stores", default="postgresql,sqlite")
    parser.add_argument("--analyze", action="store_true",
                        help="take the planner's statistics of the backlog in its enqueue's "
                             "transaction, as bench.peers' drain does")
    parser.add_argument("--pipeline", action="store_true",
                        help="run the sweepers as bench.pipeline_probe and print their claim "
                             "and group-commit sizes and times, waits and wake-ups")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="taskward-cpu-") as tmp:
        for kind in args.stores.split(","):
            logs = Path(tmp) / f"logs-{kind}"
            logs.mkdir()
            probes = ([Path(tmp) / f"probe-{kind}-{i}.json" for i in range(args.sweepers)]
                      if args.pipeline else None)
            with store(kind, Path(tmp)) as settings:
                cpu_ms, server_ms, rate = measure(settings, args.sweepers, args.tasks,
                                                  args.slots, logs, analyze=args.analyze,
                                                  probes=probes)
            print(f"{kind:10} {args.sweepers} sweeper(s) x {args.slots} slots: "
                  f"{cpu_ms:.3f} CPU-ms per task in the sweepers, {server_ms:.3f} in the "
                  f"database server, {rate:.0f} tasks/s (wall, noisy)", flush=True)
            for index, probe in enumerate(probes or []):
                print(f"  sweeper {index}: {summary(probe)}", flush=True)


if __name__ == "__main__":
    main()
