"""Does a burst's spread in arriving at llama-server move the half the server queues?
(issue 13)

Run from the repository root: `.venv/bin/python -m bench.upstream_spread` (options:
`--rounds 3`, `--tokens 128`, `--parallel 4`, `--spread-ms 12`). About 4 minutes.

Through taskward a burst of 8 streams reaches llama-server over some milliseconds (the
POSTs' group commit, then the claims), where a direct burst arrives at once; at 8
streams the half the server queues waits for the running half's 128 tokens. If
requests that arrive in different decode steps were prefilled in separate steps, and
so finished, and freed their slots, in separate steps, the spread alone would delay
the queued half. Here only the arrival differs: one direct client sends 8 streams (a)
together, (b) 3 at once and 5 `--spread-ms` later, (c) one every `--spread-ms / 2`,
rounds taking the patterns in turn, with llama-server on a core of its own (one
thread) and this process on the other, as `bench.upstream --server-cores 1` runs.
Printed per pattern: the p50 first delta, from the burst's start, of the `--parallel`
quickest streams per round and of the rest (and the rest's p50 in each round: how far
the server alone moves it from round to round).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from bench.upstream import Stream, direct, halves_ms, pooled_client, round_of, start_server

STREAMS = 8


def staggered(one: Callable[[], Stream], delays: list[float]) -> Callable[[], Stream]:
    """`one` for `round_of`: each call starts the next of `delays` seconds after the burst
    does, and its first delta is timed from the burst's start."""
    pending = iter(delays)
    lock = threading.Lock()

    def delayed() -> Stream:
        with lock:
            delay = next(pending)
        time.sleep(delay)
        stream = one()
        return replace(stream, first_delta_s=delay + stream.first_delta_s)

    return delayed


def burst(one: Callable[[], Stream], delays: list[float]) -> list[float]:
    """The first deltas of a burst of `len(delays)` streams, from its start."""
    return round_of(staggered(one, delays), len(delays))[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--spread-ms", type=float, default=12.0)
    args = parser.parse_args()
    spread = args.spread_ms / 1000
    patterns = {"together": [0.0] * STREAMS,
                f"3, then 5 at +{args.spread_ms:.0f} ms": [0.0] * 3 + [spread] * 5,
                f"one every {args.spread_ms / 2:.0f} ms": [i * spread / 2
                                                          for i in range(STREAMS)]}
    with tempfile.TemporaryDirectory() as scratch, pooled_client() as client:
        server = start_server(Path(scratch), parallel=args.parallel, threads=1,
                              server_cores=1)
        try:
            one = direct(server, args.tokens, client)
            burst(one, [0.0] * STREAMS)  # warm-up: connections, the prompt's cache
            firsts: dict[str, list[list[float]]] = {name: [] for name in patterns}
            for number in range(args.rounds):
                for name, delays in patterns.items():
                    firsts[name].append(burst(one, delays))
                print(f"round {number + 1} of {args.rounds} done, load average "
                      f"{os.getloadavg()[0]:.1f}", flush=True)
        finally:
            server.kill9()
    for name, rounds in firsts.items():
        now, queued = halves_ms(rounds, args.parallel)
        each = ", ".join(f"{halves_ms([r], args.parallel)[1]:.0f}" for r in rounds)
        print(f"{name:22} first delta p50: given a slot at once {now:.0f} ms, "
              f"queued {queued:.0f} ms (each round's: {each})")


if __name__ == "__main__":
    main()
