"""The CPU of one streaming flush transaction, back to back and after a sleep.

Run from the repository root: `.venv/bin/python -m bench.flush_gap` (options: `--tasks 4`,
`--gaps 0,0.01,0.03,0.1`, `--rounds 200`, `--synchronous FULL`). About 1 minute.

A worker's stream thread writes the text of its streams about once per flush interval
(100 ms by default), one transaction for all of them (`worker_writes.append_outputs`).
In the serving process that transaction cost ~3.5 times the CPU it costs written back
to back (docs/benchmarks.md, "Thirty-third wave"). This bench writes the same
transaction (`--tasks` running tasks on a SQLite file, one delta and a snapshot each)
`--rounds` times with `--gaps` seconds of sleep before each, in a process doing nothing
else, and prints the thread CPU per transaction at each gap: what a write costs
because the thread slept before it, apart from anything else the service runs.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.store import prepared
from core.store import claims, new_tasks, worker_writes
from core.store.births import NewTask
from core.store.database import Database
from core.store.transitions import Event

_TEXT = " word word word word"
_SNAPSHOT = '{"v":1,"text":"' + "x" * 300 + '","output_tokens":4,"input_tokens":3}'


def running_tasks(db: Database, count: int) -> list[claims.Claim]:
    """`count` tasks claimed and `running`, as a worker's streams are."""
    for _ in range(count):
        new_tasks.enqueue(db, NewTask(client_id="bench", model="m", request_json="{}"))
    held = claims.claim(db, limit=count, lease_ms=3_600_000, node_id="bench")
    for claim in held:
        worker_writes.start_running(db, claim.task_id, claim.owner_token)
    return held


def flush_of(held: list[claims.Claim]) -> list[worker_writes.OutputWrite]:
    delta = Event("response.output_text.delta",
                  {"item_id": "msg", "output_index": 0, "content_index": 0, "delta": _TEXT})
    return [worker_writes.OutputWrite(c.task_id, c.owner_token, [delta], text=_TEXT,
                                      snapshot_json=_SNAPSHOT) for c in held]


def cpu_per_write(db: Database, held: list[claims.Claim], gap: float, rounds: int) -> float:
    """Thread CPU-ms of one flush transaction, each written `gap` seconds after the last."""
    cpu = 0.0
    for _ in range(rounds):
        time.sleep(gap)
        started = time.thread_time()
        failures = worker_writes.append_outputs(db, flush_of(held))
        cpu += time.thread_time() - started
        assert failures == [None] * len(held)
    return cpu / rounds * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--gaps", default="0,0.01,0.03,0.1")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--synchronous", choices=("FULL", "NORMAL"), default="FULL")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        db = prepared(f"sqlite:///{Path(scratch) / 'flush.db'}",
                      sqlite_synchronous=args.synchronous)
        held = running_tasks(db, args.tasks)
        cpu_per_write(db, held, 0, 50)  # warm-up: the statements prepared, pages read
        print(f"one flush of {args.tasks} tasks on SQLite ({args.synchronous}), thread "
              f"CPU-ms per transaction by the sleep before it:")
        for gap in (float(g) for g in args.gaps.split(",")):
            print(f"  {gap * 1000:5.0f} ms: {cpu_per_write(db, held, gap, args.rounds):.3f}")
        db.dispose()


if __name__ == "__main__":
    main()
