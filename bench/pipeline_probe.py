"""A `taskward sweeper` that records its drain pipeline, for `bench.sweeper_cpu --pipeline`.

Run in place of `taskward sweeper` (`python -m bench.pipeline_probe`), it wraps the
steps of a slot's cycle before starting the real command: each claim (wall, the
claimer thread's CPU, tasks taken), each wait for slots before a claim, each group
commit's gathering and write (wall, tasks), the runners' and engine threads' wake-ups
from a condition's wait (a group commit's members and its gathering leader), the
attempts settled by a runner thread (not by their engine thread, `scheduler.handoff`),
and the collector's time (`gc.callbacks`); and it reads the threads' context switches
and CPU, by kind of thread, from /proc at the drain's first claim and after its last.
On exit it writes them as JSON to the file `BENCH_PROBE_OUT` names. The wrappers cost
a little CPU of their own: compare CPU per task without `--pipeline`.
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import scheduler.group_commit as group_commit
import scheduler.workers as workers

RECORD: dict[str, Any] = {"claims": [], "slot_waits": [], "gathers": [], "writes": [],
                          "collector": [0.0, 0], "wakeups": 0, "submits": 0, "runners": 0}


def switches() -> dict[str, list[float]]:
    """(voluntary, involuntary) context switches and CPU seconds of this process's live
    threads, by kind of thread (runner, engine, claimer, ...: the Python name without
    its number). The CPU is each thread's own clock (`pthread_getcpuclockid`), not
    /proc's per-thread ticks: on this machine's kernel those miss most of the engine
    threads' short runs (0.01 s of ~0.5 s a sweeper spent in them)."""
    threads = {thread.native_id: thread for thread in threading.enumerate()}
    counts: dict[str, list[float]] = {}
    for task in Path("/proc/self/task").iterdir():
        thread = threads.get(int(task.name))
        try:
            status = (task / "status").read_text()
            cpu = (time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
                   if thread is not None and thread.ident is not None else 0.0)
        except (OSError, ProcessLookupError):  # the thread ended meanwhile
            continue
        count = counts.setdefault("other" if thread is None else _kind(thread.name), [0, 0, 0.0])
        count[2] += cpu
        for line in status.splitlines():
            if line.startswith("voluntary_ctxt_switches"):
                count[0] += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches"):
                count[1] += int(line.split()[1])
    return counts


def _kind(name: str) -> str:
    """A thread's kind from its name: `taskward-runner_3` -> runner, `engine-…` -> engine."""
    if name.startswith("engine-"):
        return "engine"
    return name.removeprefix("taskward-").split("_")[0].split(" ")[0]


def _timed(record: list[Any], run: Callable[..., Any],
           size: Callable[[Any, tuple[Any, ...]], int | None]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start, cpu = time.monotonic(), time.thread_time()
        result = run(*args, **kwargs)
        record.append((start, time.monotonic(), size(result, args), time.thread_time() - cpu))
        return result
    return wrapper


def _claim_recorded(claim: Callable[[workers.Workers], int]) -> Callable[[workers.Workers], int]:
    """A claim that also marks the drain's start (the first claim taking work) and,
    after every claim that took none once work was taken, its end so far."""
    timed = _timed(RECORD["claims"], claim, lambda taken, _args: taken)

    def wrapper(self: workers.Workers) -> int:
        took_before = any(c[2] for c in RECORD["claims"])
        taken: int = timed(self)
        if taken and not took_before:
            RECORD["switches_start"] = switches()
        elif not taken and took_before:
            RECORD["switches_end"] = switches()
        return taken
    return wrapper


def _counting_wait(wait: Callable[..., bool]) -> Callable[..., bool]:
    def wrapper(self: threading.Condition, timeout: float | None = None) -> bool:
        woken = wait(self, timeout)
        if threading.current_thread().name.startswith(("taskward-runner", "engine-")):
            RECORD["wakeups"] += 1  # a runner or engine thread in `GroupCommit.submit`
        return woken
    return wrapper


def _collector(phase: str, _info: dict[str, Any]) -> None:
    if phase == "start":
        RECORD["collector_started"] = time.thread_time()
    else:
        RECORD["collector"][0] += time.thread_time() - RECORD["collector_started"]
        RECORD["collector"][1] += 1


def install() -> None:
    """Wrap the pipeline's steps (before the sweeper starts)."""
    workers.Workers.claim = _claim_recorded(workers.Workers.claim)  # type: ignore[method-assign,assignment]
    workers.Workers.gather_slots = _timed(  # type: ignore[method-assign]
        RECORD["slot_waits"], workers.Workers.gather_slots, lambda _r, _a: None)
    workers.Workers._complete_group = _timed(  # type: ignore[method-assign]
        RECORD["writes"], workers.Workers._complete_group, lambda _r, args: len(args[1]))
    group_commit.gather = _timed(RECORD["gathers"], group_commit.gather, lambda _r, _a: None)
    submit = group_commit.GroupCommit.submit

    def counted_submit(self: group_commit.GroupCommit[Any], *args: Any) -> None:
        RECORD["submits"] += 1
        submit(self, *args)
    group_commit.GroupCommit.submit = counted_submit  # type: ignore[method-assign,assignment]
    settle = workers.Workers._settle

    def counted_settle(self: workers.Workers, attempt: Any, step: Any, **kwargs: Any) -> None:
        if threading.current_thread().name.startswith("taskward-runner"):
            RECORD["runners"] += 1  # upstream, or handed to a runner (`Handoffs`)
        settle(self, attempt, step, **kwargs)
    workers.Workers._settle = counted_settle  # type: ignore[method-assign,assignment]
    threading.Condition.wait = _counting_wait(threading.Condition.wait)  # type: ignore[method-assign]
    gc.callbacks.append(_collector)
    out = os.environ["BENCH_PROBE_OUT"]
    atexit.register(lambda: Path(out).write_text(json.dumps(
        {k: v for k, v in RECORD.items() if k != "collector_started"})))


if __name__ == "__main__":
    install()
    from infra.cli import main

    sys.argv = ["taskward", "sweeper"]
    main()


def summary(path: Path) -> str:
    """One sweeper's pipeline, as `bench.sweeper_cpu --pipeline` prints it."""
    record = json.loads(path.read_text())
    claims = [c for c in record["claims"] if c[2]]
    if not claims or "switches_end" not in record:
        return "took no work"
    start, end = claims[0][0], max(w[1] for w in record["writes"])
    wall = end - start
    tasks = sum(c[2] for c in claims)

    def within(rows: list[Any]) -> list[Any]:
        return [r for r in rows if start <= r[0] <= end]

    def busy(rows: list[Any]) -> float:
        return 100 * sum(r[1] - r[0] for r in within(rows)) / wall

    def median_ms(rows: list[Any]) -> float:
        return 1000 * statistics.median(r[1] - r[0] for r in rows)

    def sizes(rows: list[Any]) -> str:
        return ", ".join(f"{n}: {k}" for n, k in Counter(r[2] for r in rows).most_common(4))

    start_counts, end_counts = record["switches_start"], record["switches_end"]
    by_kind = {kind: [b - a for a, b in zip(start_counts.get(kind, [0, 0, 0.0]), counts,
                                            strict=True)]
               for kind, counts in end_counts.items()}
    voluntary = sum(v for v, _, _ in by_kind.values())
    involuntary = sum(i for _, i, _ in by_kind.values())
    kinds = ", ".join(f"{kind} {v / tasks:.2f}/{i / tasks:.2f}" for kind, (v, i, _)
                      in sorted(by_kind.items(), key=lambda kv: -kv[1][0]) if v + i)
    cpu = ", ".join(f"{kind} {1000 * c / tasks:.3f}" for kind, (_, _, c)
                    in sorted(by_kind.items(), key=lambda kv: -kv[1][2]) if c)
    every = within(record["claims"])
    return (f"{tasks} tasks in {wall:.2f} s; claims {len(every)} (sizes {sizes(every)}), "
            f"median {median_ms(claims):.2f} ms wall, "
            f"{1000 * statistics.median(c[3] for c in claims):.2f} ms claimer CPU; claimer "
            f"in claims {busy(record['claims']):.0f} %, waiting for slots "
            f"{busy(record['slot_waits']):.0f} %; group writes {len(record['writes'])} "
            f"(sizes {sizes(record['writes'])}), median {median_ms(record['writes']):.2f} ms, "
            f"writing {busy(record['writes']):.0f} %, gathering median "
            f"{median_ms(record['gathers']):.2f} ms; context switches per task "
            f"{voluntary / tasks:.2f} voluntary, {involuntary / tasks:.2f} involuntary ({kinds}); "
            f"CPU-ms per task by thread ({cpu}); "
            f"attempts settled by a runner thread {record['runners']}; "
            f"runner condition wake-ups per completion "
            f"{record['wakeups'] / max(1, record['submits']):.2f}; collector "
            f"{1000 * record['collector'][0]:.0f} ms in {record['collector'][1]} collections")
