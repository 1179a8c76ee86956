"""taskward beside Procrastinate and PgQueuer on the same PostgreSQL, in one run.

Run from the repository root: `.venv/bin/python -m bench.peers [--quick]`.

The peers are installed by this script into their own virtualenv under
`~/.cache/taskward/bench-peers/` (never into taskward's), and driven by our own code
(`bench/peer_drivers/`), each workload at the system's best documented setting for it
(PgQueuer: `batch_size` 8 for the drain, 1 for latency). Every system gets a fresh
private database per workload:
- drain: `--jobs` no-op jobs bulk-inserted, `ANALYZE`, then 2 worker processes × 16
  slots started; jobs/s from the first job's start to the last finish, each
  process's time from spawn to its first job (taskward: `taskward sweeper`), and the
  CPU per job of the worker processes (each from its first job to the last finish)
  and of their PostgreSQL backends (from /proc);
- enqueue: 8 concurrent producers, one job per call, for `--seconds` (taskward: HTTP
  `POST /v1/responses` against `taskward serve`, one worker process as by default,
  `--serve-workers` to change it); jobs/s and the acknowledgement latency, of
  acknowledged calls only (an answer other than 202 is a problem of the run);
- latency: 100 jobs/s one by one into 2 running workers × 16 slots; pickup (enqueue
  call -> job start) and end to end (enqueue call -> finish stamped in the database).
A job's start is, for every system, the moment its job function (taskward: the
bench's plug-in engine, `bench/noop_engine.py`) is entered, noted by it in a file of
its own. Every job of every workload is checked to have finished (drain, latency),
each executed once by those notes, or been stored (enqueue) exactly once. Beside
them, the raw one-row commit rate of the same PostgreSQL in the same run. Then
taskward alone on SQLite, with a bare Litestar POST handler served the same way as
the HTTP stack's ceiling. Rounds rotate the order of the systems (3 by default: each
of the three PostgreSQL systems once in each position); figures are medians over
rounds. The machine is shared and noisy: read the ratios, which are printed last,
beside the CPU the hypervisor stole from this VM during each system's rounds
(`bench.steal`).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy.engine import make_url

from bench.peer_systems import (
    ROOT,
    BareLitestar,
    Taskward,
    Timeline,
    pgqueuer,
    procrastinate,
    rows,
)
from bench.startup import Checkout, compile_sources
from bench.steal import Steal, percents
from bench.store import raw_pg_rate
from bench.sweeper_cpu import cpu_seconds, server_cpu
from tests.databases import private_pg_database
from tests.scheduler.processes import wait_until

PEER_REQUIREMENTS = ("procrastinate==3.10.0", "pgqueuer==1.6.0",
                     "typer<0.29",  # pgqueuer 1.6's CLI breaks on typer 0.29
                     "asyncpg==0.32.0", "psycopg[binary,pool]==3.3.*")
WORKERS, SLOTS, PRODUCERS, RATE = 2, 16, 8, 100.0
# One full rotation of the three PostgreSQL systems' order: each runs once in each slot.
ROUNDS = 3
# How often the bench asks whether the jobs are done, each time on a new connection (a
# PostgreSQL backend started and a count): at 50 per second, as before, that took CPU
# from the drain it watched on this 2-core box. The figures come from the jobs' own
# timestamps, so a slower poll changes none of them.
_POLL_SECONDS = 0.25
# How often the drain's worker processes' CPU is read (two /proc reads): a worker's CPU
# is cut at its first job to within this.
_CPU_SAMPLE_SECONDS = 0.01


class System(Protocol):
    name: str

    def database(self, workdir: Path) -> Any: ...
    def fill(self, url: str, count: int) -> None: ...
    def workers(self, url: str, count: int, slots: int, logs: Path,
                workload: str) -> Any: ...
    def enqueue(self, url: str, producers: int, seconds: float,
                logs: Path) -> dict[str, Any]: ...
    def paced(self, url: str, rate: float, count: int,
              logs: Path) -> list[tuple[str, float]]: ...
    def finished(self, url: str) -> int: ...
    def stored(self, url: str) -> int: ...
    def timeline(self, url: str, logs: Path, workers: int) -> Timeline: ...


def peer_python() -> Path:
    """The peers' virtualenv interpreter, created and filled once per requirement set and
    base interpreter: the peers run on the same Python build as taskward's virtualenv."""
    tag = hashlib.sha256("\n".join([*PEER_REQUIREMENTS, sys.base_prefix, sys.version])
                         .encode()).hexdigest()[:12]
    home = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    venv = home / "taskward" / "bench-peers" / tag
    python, stamp = venv / "bin" / "python", venv / ".installed"
    if not stamp.exists():
        print(f"installing the peers into {venv} (once)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *PEER_REQUIREMENTS],
                       check=True)
        stamp.touch()
    return python


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


@dataclass
class Figures:
    """One system's figures over the rounds (each list: one value per round)."""

    drain: list[float] = field(default_factory=list)
    # CPU ms per drained job: of the worker processes, of their PostgreSQL backends.
    drain_cpu_ms: list[tuple[float, float]] = field(default_factory=list)
    first_claim_ms: list[float] = field(default_factory=list)
    enqueue: list[float] = field(default_factory=list)
    ack_ms: list[tuple[float, float]] = field(default_factory=list)
    pickup_ms: list[tuple[float, float]] = field(default_factory=list)
    e2e_ms: list[tuple[float, float]] = field(default_factory=list)
    # Per workload, the per cent of the machine's CPU time stolen while it ran (`bench.steal`).
    stolen: dict[str, list[float]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def exactly_once(name: str, timeline: Timeline, expected: set[str] | int) -> list[str]:
    """What is wrong with the run: jobs not finished, or executed other than once."""
    problems = []
    count = len(expected) if isinstance(expected, set) else expected
    repeated = [job for job, runs in timeline.executions.items() if runs != 1]
    if repeated:
        problems.append(f"{name}: {len(repeated)} job(s) executed more than once")
    if len(timeline.finishes) != count or len(timeline.executions) != count:
        problems.append(f"{name}: {len(timeline.finishes)} finished and "
                        f"{len(timeline.executions)} executed of {count}")
    if isinstance(expected, set) and set(timeline.finishes) != expected:
        problems.append(f"{name}: the finished jobs are not the enqueued ones")
    reclaimed = [job for job, claims in (timeline.claims or {}).items() if claims != 1]
    if reclaimed:
        problems.append(f"{name}: {len(reclaimed)} job(s) claimed more than once")
    return problems


class CpuSamples:
    """The CPU seconds of some processes, stamped with the wall clock every
    `_CPU_SAMPLE_SECONDS` on a thread of the bench, so that a worker's CPU can be cut at
    its first job (the timeline's epochs): its start-up is the start-up figure's, not
    the drain's."""

    def __init__(self, pids: list[int]) -> None:
        self._pids = pids
        self.samples: list[tuple[float, list[float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CpuSamples:
        self._take()
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._take()

    def _run(self) -> None:
        while not self._stop.wait(_CPU_SAMPLE_SECONDS):
            self._take()

    def _take(self) -> None:
        last = self.samples[-1][1] if self.samples else [0.0] * len(self._pids)
        self.samples.append((time.time(), [_cpu_or(pid, was) for pid, was
                                           in zip(self._pids, last, strict=True)]))

    def between(self, index: int, start: float, end: float) -> float:
        """Process `index`'s CPU seconds from the last sample at or before `start` to the
        first at or after `end` (at most one sample period more than the span; the last
        sample, taken on leaving, is after any job's end)."""
        before = [cpu[index] for at, cpu in self.samples if at <= start]
        after = [cpu[index] for at, cpu in self.samples if at >= end]
        return after[0] - (before[-1] if before else self.samples[0][1][index])


def _cpu_or(pid: int, was: float) -> float:
    """The process's CPU seconds, or `was` once it has ended (a worker that crashed:
    `exactly_once` reports what it left undone)."""
    try:
        return cpu_seconds(pid)
    except OSError:
        return was


def drain(system: System, workdir: Path, jobs: int, figures: Figures) -> None:
    logs = workdir / f"logs-{system.name}-drain-{time.time_ns()}"
    logs.mkdir()
    with system.database(workdir) as url:
        system.fill(url, jobs)
        analyze(url)
        database = make_url(url).database or ""
        served = server_cpu(database)  # none of the workers' yet
        with system.workers(url, WORKERS, SLOTS, logs, "drain") as children, \
                CpuSamples([child.process.pid for child in children]) as samples:
            wait_until(lambda: system.finished(url) >= jobs, timeout=900,
                       what=f"{system.name} drained", every=_POLL_SECONDS)
            time.sleep(0.3)  # a repeated execution would show up now
            serving = server_cpu(database)
        timeline = system.timeline(url, logs, len(children))
    figures.problems += exactly_once(system.name, timeline, jobs)
    last = max(timeline.finishes.values())
    span = last - min(timeline.starts.values())
    figures.drain.append(jobs / span)
    figures.first_claim_ms.append(max(
        ((at - children[i].spawned_at) * 1000 for i, at in timeline.first_starts.items()),
        default=float("nan")))
    workers = sum(samples.between(i, at, last) for i, at in timeline.first_starts.items())
    # The backends from their connections on: a few ms each, against seconds of drain.
    server = sum(cpu - served.get(pid, 0.0) for pid, cpu in serving.items())
    figures.drain_cpu_ms.append((1000 * workers / jobs, 1000 * server / jobs))


def enqueue(system: System, workdir: Path, seconds: float, figures: Figures) -> None:
    logs = workdir / f"logs-{system.name}-enqueue-{time.time_ns()}"
    logs.mkdir()
    with system.database(workdir) as url:
        result = system.enqueue(url, PRODUCERS, seconds, logs)
        stored = system.stored(url)
    if stored != result["count"]:
        figures.problems.append(f"{system.name}: {result['count']} acknowledged, "
                                f"{stored} stored")
    refused = {status: n for status, n in result.get("statuses", {}).items() if status != 202}
    if refused:  # the peers' producers stop at an enqueue error
        figures.problems.append(f"{system.name}: {sum(refused.values())} enqueue call(s) "
                                f"not acknowledged (statuses {refused})")
    figures.enqueue.append(result["count"] / result["seconds"])
    latencies = [x * 1000 for x in result["latencies"]]  # acknowledged calls only
    figures.ack_ms.append((percentile(latencies, 0.5), percentile(latencies, 0.99)))


def latency(system: System, workdir: Path, count: int, figures: Figures) -> None:
    logs = workdir / f"logs-{system.name}-latency-{time.time_ns()}"
    logs.mkdir()
    with system.database(workdir) as url:
        with system.workers(url, WORKERS, SLOTS, logs, "latency") as children:
            warm = system.paced(url, RATE, 20, logs)  # start-up is the drain's figure
            sent = system.paced(url, RATE, count, logs)
            total = len(warm) + len(sent)
            wait_until(lambda: system.finished(url) >= total, timeout=120,
                       what=f"{system.name} finished the paced jobs", every=_POLL_SECONDS)
            time.sleep(0.3)
        timeline = system.timeline(url, logs, len(children))
    figures.problems += exactly_once(system.name, timeline,
                                     {job for job, _ in warm + sent})
    figures.pickup_ms.append(_quantiles([(timeline.starts[j] - t0) * 1000 for j, t0 in sent]))
    figures.e2e_ms.append(_quantiles([(timeline.finishes[j] - t0) * 1000 for j, t0 in sent]))


def _quantiles(values: list[float]) -> tuple[float, float]:
    return percentile(values, 0.5), percentile(values, 0.99)


def analyze(url: str) -> None:
    """Fresh statistics after a bulk fill, for every system alike (a planner without
    them made Procrastinate's claim read every queued row)."""
    rows(url, "ANALYZE")


def raw_ceiling() -> float:
    with private_pg_database() as url:
        return raw_pg_rate(url, 2000)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def number(value: float) -> str:
    return "-" if value != value else f"{value:,.0f}"  # NaN: not measured


def times(value: float) -> str:
    return "-" if value != value else f"{value:.2f}x"  # NaN: a workload not run


def median_pair(pairs: list[tuple[float, float]]) -> str:
    if not pairs:
        return "-"
    return f"{median([p for p, _ in pairs]):.1f} / {median([q for _, q in pairs]):.1f}"


def table(results: dict[str, Figures]) -> list[str]:
    lines = [f"| {'system':16} | drain jobs/s | spawn→first job ms | enqueue jobs/s | "
             "ack p50 / p99 ms | pickup p50 / p99 ms | e2e p50 / p99 ms |",
             "|---|---|---|---|---|---|---|"]
    for name, f in results.items():
        lines.append(f"| {name:16} | {number(median(f.drain))} | "
                     f"{number(median(f.first_claim_ms))} | {number(median(f.enqueue))} | "
                     f"{median_pair(f.ack_ms)} | "
                     f"{median_pair(f.pickup_ms)} | {median_pair(f.e2e_ms)} |")
    return lines


def drain_cpu_lines(results: dict[str, Figures]) -> list[str]:
    """Each system's CPU per drained job, medians over the rounds: unlike the rate, it
    hardly moves with what else the machine does, and it says which side bounds the
    drain on these two cores."""
    lines = []
    for name, f in results.items():
        if f.drain_cpu_ms:
            workers = median([w for w, _ in f.drain_cpu_ms])
            server = median([d for _, d in f.drain_cpu_ms])
            lines.append(f"{name}: drain CPU per job {workers:.3f} ms in the workers"
                         + (f" + {server:.3f} in PostgreSQL = {workers + server:.3f}"
                            if server else ""))
    return lines


def steal_lines(results: dict[str, Figures]) -> list[str]:
    """Each system's workloads with the CPU the hypervisor stole while each round of it
    ran: a round with a high figure was measured on a machine running slower."""
    return [f"{name}: CPU stolen by the hypervisor, per round: " + "; ".join(
        f"{workload} {percents(shares)}"
        for workload, shares in f.stolen.items()) for name, f in results.items() if f.stolen]


def ratio_lines(results: dict[str, Figures], ours: str, peers: list[str],
                ceiling: float | None) -> list[str]:
    mine = results[ours]
    lines = []
    for peer in peers:
        if peer in results:
            theirs = results[peer]
            drain = times(median(mine.drain) / median(theirs.drain))
            enqueue = times(median(mine.enqueue) / median(theirs.enqueue))
            lines.append(f"{ours} / {peer}: drain {drain}, enqueue {enqueue}")
    if ceiling:
        lines.append(f"{ours}: drain {times(median(mine.drain) / ceiling)} and enqueue "
                     f"{times(median(mine.enqueue) / ceiling)} the raw one-row commit rate")
    return lines


def order_of(systems: list[System], round_index: int) -> list[System]:
    """The systems' order in round `round_index`: rotated by one each round, so that over
    a whole number of rotations (`--rounds` a multiple of the systems' count) each
    system runs once in each position."""
    shift = round_index % len(systems)
    return systems[shift:] + systems[:shift]


def over_rounds(rounds: int) -> str:
    """What a figure is over the rounds (`median` of two values is their mean)."""
    return {1: "1 round", 2: "mean of 2 rounds"}.get(rounds, f"median of {rounds} rounds")


def run_rounds(systems: list[System], rounds: int, workdir: Path, args: argparse.Namespace,
               extra: Callable[[int], None] = lambda _r: None) -> dict[str, Figures]:
    results = {system.name: Figures() for system in systems}
    for r in range(rounds):
        order = order_of(systems, r)
        steps = {"drain": lambda s: drain(s, workdir, args.jobs, results[s.name]),
                 "enqueue": lambda s: enqueue(s, workdir, args.seconds, results[s.name]),
                 "latency": lambda s: latency(s, workdir, args.latency_jobs, results[s.name])}
        for workload in args.workloads.split(","):
            for system in order:
                steal = Steal()
                steps[workload](system)
                results[system.name].stolen.setdefault(workload, []).append(steal.percent())
        extra(r)
        print(f"round {r + 1} of {rounds} done, load average "
              f"{os.getloadavg()[0]:.1f}", flush=True)
    return results


def postgres_section(pg: list[System], workdir: Path, args: argparse.Namespace) -> list[Figures]:
    ceilings: list[float] = []
    results = run_rounds(pg, args.rounds, workdir, args,
                         extra=lambda _r: ceilings.append(raw_ceiling()))
    print(f"\nPostgreSQL, each figure the {over_rounds(args.rounds)}; raw one-row commits "
          f"{median(ceilings):,.0f}/s in the same run")
    print("\n".join(table(results) + drain_cpu_lines(results) + steal_lines(results)))
    if "taskward" in results:
        print("\n".join(ratio_lines(results, "taskward", ["pgqueuer", "procrastinate"],
                                    median(ceilings))))
    return list(results.values())


def sqlite_section(workdir: Path, args: argparse.Namespace) -> list[Figures]:
    results = run_rounds([Taskward("sqlite", args.sqlite_workers)], args.rounds, workdir, args)
    bare = results[BareLitestar.name] = Figures()
    for _ in range(args.rounds if "enqueue" in args.workloads else 0):
        logs = workdir / f"logs-bare-{time.time_ns()}"
        logs.mkdir()
        result = BareLitestar(args.sqlite_workers).enqueue(PRODUCERS, args.seconds, logs)
        bare.enqueue.append(result["count"] / result["seconds"])
        bare.ack_ms.append(_quantiles([x * 1000 for x in result["latencies"]]))
    print(f"\nSQLite: taskward alone (`taskward run` for latency), beside a bare Litestar "
          f"POST handler served the same way ({args.sqlite_workers} granian worker(s)); "
          f"each figure the {over_rounds(args.rounds)}")
    print("\n".join(table(results) + drain_cpu_lines(results) + steal_lines(results)))
    ours = median(results["taskward-sqlite"].enqueue)
    print(f"taskward-sqlite POST / bare Litestar POST: {times(ours / median(bare.enqueue))}")
    return list(results.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="a bounded smoke run: 1,000 jobs, 2 s, 100 paced, 1 round")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--latency-jobs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--systems", default="taskward,procrastinate,pgqueuer,sqlite")
    parser.add_argument("--workloads", default="drain,enqueue,latency")
    # One store writer: a second API process splits the group commit in two (both
    # handlers get the same count; 1 is what `taskward serve` and `taskward run` use).
    parser.add_argument("--sqlite-workers", type=int, default=1)
    # On PostgreSQL too, `taskward serve`'s default: on these 2 cores, shared with the
    # producers and the server, one process makes batches of ~4 POSTs per commit where
    # two make ~2.5 each and pay a batch's cost twice (docs/benchmarks.md).
    parser.add_argument("--serve-workers", type=int, default=1)
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.seconds, args.latency_jobs, args.rounds = 1000, 2.0, 100, 1
    wanted = args.systems.split(",")
    # The peers' packages were compiled when pip installed them; taskward's editable
    # sources are compiled here, or every spawned process would compile them again.
    compile_sources(Checkout(ROOT))
    print(f"load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="taskward-peers-") as tmp:
        workdir = Path(tmp)
        pg: list[System] = ([Taskward("postgresql", args.serve_workers)]
                            if "taskward" in wanted else [])
        if {"procrastinate", "pgqueuer"} & set(wanted):
            python = peer_python()
            pg += [make(python) for make in (procrastinate, pgqueuer) if make.__name__ in wanted]
        figures = postgres_section(pg, workdir, args) if pg else []
        if "sqlite" in wanted:
            figures += sqlite_section(workdir, args)
    problems = [problem for f in figures for problem in f.problems]
    print("\nexactly once: " + ("every job of every system" if not problems
                                else "; ".join(problems)))
    print(f"load average at end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
