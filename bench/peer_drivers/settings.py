"""Each peer's settings per workload, in a module of their own: the drivers import
their queue's package, which only the peers' virtualenv has, and taskward's tests check
these settings without it.
"""

from __future__ import annotations

import argparse


def batch_size(slots: int, workload: str) -> int:
    """8 for the drain (fewer round trips per job), 1 for latency: PgQueuer's completion
    buffer is flushed at `batch_size` entries or after ~0.1 s, so with jobs arriving
    one by one a larger batch holds each completion until the timer fires."""
    return 1 if workload == "latency" else min(8, slots // 2)


def pool_size(args: argparse.Namespace) -> int:
    """A worker's pool holds a connection per slot and two more (fetching, LISTEN), so
    no job waits for a connection; producers get one each (the pool's default minimum
    is 4)."""
    return args.slots + 2 if args.step == "worker" else max(2, args.producers)
