"""How much a saturated llama-server on this box loses to another process beside it.

Run from the repository root: `.venv/bin/python -m bench.upstream_noise` (options:
`--share 0.12`, `--wakeups 1000`, `--touch 0`, `--nice 0` or `--idle`,
`--concurrency 8`, `--rounds 3`, `--tokens 128`).
About a minute.

`bench.upstream` compares llama-server called directly with the same server behind
`taskward run`, which spends CPU per streamed token on the same 2 cores. This bench
asks what any process spending that much would cost: direct rounds as in
`bench.upstream` (`--parallel 4 -t 2`, greedy) alternate with and without a burner
process that wakes `--wakeups` times a second and spins for `--share` of one core in
all (`bench.upstream` prints taskward's share at 8 streams as CPU-s/s). The ratio of
the two aggregate rates is the ceiling of `bench.upstream`'s ratio at that share, and
the change in first-token p50 what that share alone adds to it: at 8 streams the
second half of the requests waits for the first half to finish, so every percent the
first half is slowed adds to their first token.

`--idle` runs the burner under `SCHED_IDLE`, as `bench.upstream --idle` runs taskward:
it then spins only on a core the server leaves idle and never preempts it. Its spin
touches almost no memory, so a slowdown it still causes is neither preemption nor the
caches; `--touch 16` makes it write round 16 MiB as it spins (each core's L2 is 2 MiB
here, the shared L3 32), so a slowdown only then is the caches. The bench prints the
CPU the burner did get, a second of the round.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.upstream import (
    cpu_seconds,
    deprioritise,
    direct,
    pooled_client,
    round_of,
    start_server,
)


def burn(share: float, wakeups: int, touch_mib: int) -> None:
    """Spend `share` of a core, in `wakeups` bursts a second, until killed; with
    `touch_mib`, writing its way round a buffer that large while it spins, to take the
    caches from the server as well as the CPU. Its niceness or `SCHED_IDLE` is set from
    outside, by `deprioritise`, as `bench.upstream` sets taskward's.

    Each burst spins for its share of CPU time (not of wall time), as a process with a
    fixed cost per token does: preempted, it takes longer rather than spending less.
    """
    buffer = memoryview(bytearray(touch_mib << 20))
    piece = bytes(64 << 10)
    offset = 0
    period = 1.0 / wakeups
    spin = share * period
    wake = time.perf_counter()
    while True:
        until = time.thread_time() + spin
        while time.thread_time() < until:
            if buffer:
                buffer[offset:offset + len(piece)] = piece
                offset = (offset + len(piece)) % len(buffer)
        wake += period
        time.sleep(max(0.0, wake - time.perf_counter()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--share", type=float, default=0.12, help="of one core")
    parser.add_argument("--wakeups", type=int, default=1000, help="bursts per second")
    parser.add_argument("--touch", type=int, default=0, metavar="MIB",
                        help="the burner also writes round a buffer of this many MiB")
    priority = parser.add_mutually_exclusive_group()  # SCHED_IDLE has no niceness
    priority.add_argument("--nice", type=int, default=0, help="the burner's niceness")
    priority.add_argument("--idle", action="store_true",
                          help="run the burner under SCHED_IDLE: on cores the server leaves idle")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--burn", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.burn:
        burn(args.share, args.wakeups, args.touch)
        return
    rates: dict[str, list[float]] = {"alone": [], "beside the burner": []}
    firsts: dict[str, list[float]] = {name: [] for name in rates}
    burned: list[float] = []  # the burner's CPU-s per second of each round
    with tempfile.TemporaryDirectory() as scratch, pooled_client() as client:
        server = start_server(Path(scratch) / "llama", parallel=4, threads=2, server_cores=0)
        try:
            one = direct(server, args.tokens, client)
            round_of(one, 1)  # warm-up: the prompt cache
            for _ in range(args.rounds):
                for name in rates:
                    burner = None if name == "alone" else subprocess.Popen(
                        [sys.executable, "-m", "bench.upstream_noise", "--burn",
                         "--share", str(args.share), "--wakeups", str(args.wakeups),
                         "--touch", str(args.touch)], process_group=0)
                    try:
                        if burner is not None:
                            deprioritise(burner.pid, niceness=args.nice, idle=args.idle)
                            time.sleep(0.2)  # past the interpreter's start
                            began, burned_before = time.perf_counter(), cpu_seconds(burner.pid)
                        rate, ttfts = round_of(one, args.concurrency)
                        if burner is not None:
                            burned.append((cpu_seconds(burner.pid) - burned_before)
                                          / (time.perf_counter() - began))
                    finally:
                        if burner is not None:
                            burner.kill()
                            burner.wait()
                    rates[name].append(rate)
                    firsts[name] += ttfts
        finally:
            server.kill9()
    burner_class = "under SCHED_IDLE" if args.idle else f"at niceness {args.nice}"
    touching = f", writing round {args.touch} MiB," if args.touch else ""
    print(f"concurrency {args.concurrency}, burner {args.share:.2f} of a core{touching} in "
          f"{args.wakeups} wake-ups/s {burner_class}, {args.rounds} rounds each; it got "
          f"{min(burned):.3f}-{max(burned):.3f} CPU-s/s:")
    for name in rates:
        print(f"  {name:18} best {max(rates[name]):.0f} tokens/s, "
              f"TTFT p50 {statistics.median(firsts[name]) * 1000:.0f} ms")
    alone, beside = (max(rates[name]) for name in rates)
    shift = (statistics.median(firsts["beside the burner"])
             - statistics.median(firsts["alone"])) * 1000
    print(f"ratio {beside / alone:.2f}, first-token p50 {shift:+.0f} ms")


if __name__ == "__main__":
    main()
