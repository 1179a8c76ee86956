"""taskward's CPU and wake-ups per streamed token in front of a fixed-rate stand-in for
llama-server, so that the figure does not move with the machine's load.

Run from the repository root: `.venv/bin/python -m bench.upstream_cpu` (options:
`--rounds 3`, `--streams 8`, `--tokens 128`, `--rate 40`, `--slots 4`, `--lockstep`).
About 30 s.

The stand-in (an asyncio server on a thread of this process) streams llama-server's Chat
Completions chunk shapes (one `data:` event per token, then the finish, the usage and
`[DONE]`) at `--rate` tokens/s per request, serving `--slots` requests at once and
queueing the rest, as `llama-server --parallel 4` does; with `--lockstep` the streams
with a slot send each token on one shared tick, as llama-server's batched decode makes
them (its streams' tokens then reach taskward together, not spread out). A `taskward
run` on SQLite (an upstream entry with `max_concurrency` 8) takes `--streams` `POST
/v1/responses` streams (`background: false, stream: true`, read to the end as
`bench.upstream` reads them) per round. Printed: the CPU time (user + system) and the
voluntary context switches of every thread of the `taskward run` process group, from
/proc, per generated token over the rounds, in all and by thread (each taskward thread
names itself for the kernel, `core.thread_names`; numbered pool threads are summed as
one kind: `runner_*`). A thread that ends during the rounds (an attempt's engine thread)
takes its switches with it, so the counters are sampled every 0.2 s and summed per
thread.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from bench.upstream import MODEL, group_stats, pooled_client, round_of, through_taskward
from tests.scheduler.processes import Children, run_command, run_json
from tests.service.running import Runs, run_env
from tests.upstream.scripted import chunk, read_request


def _event(payload: dict[str, object]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def _delta(text: str | None, finish: str | None = None) -> bytes:
    return _event({"choices": [{"finish_reason": finish, "index": 0,
                                "delta": {} if text is None else {"content": text}}],
                   "created": 1764600000, "id": "chatcmpl-bench", "model": "smollm2",
                   "system_fingerprint": "b1-bench", "object": "chat.completion.chunk"})


class StandIn:
    """Chat Completions streams at a fixed rate per request, `slots` at a time; with
    `lockstep`, every stream with a slot sends its next token on one shared tick, as
    llama-server does (one decode step makes a token for every busy slot)."""

    def __init__(self, rate: float, slots: int, *, lockstep: bool = False) -> None:
        self._pause = 1 / rate
        self._slots = slots
        self._lockstep = lockstep
        self._tick: asyncio.Future[None] | None = None
        self.port = 0
        ready = threading.Event()
        threading.Thread(target=asyncio.run, args=(self._serve(ready),), daemon=True).start()
        ready.wait(10)

    async def _serve(self, ready: threading.Event) -> None:
        self._free = asyncio.Semaphore(self._slots)
        server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        await server.serve_forever()

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        try:
            while True:  # keep-alive: one request after another
                await self._answer(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _, body = await read_request(reader)
        tokens = int(json.loads(body).get("max_tokens") or 16)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")

        async with self._free:
            for _ in range(tokens):
                writer.write(chunk(_delta(" word")))
                await writer.drain()
                await (self._next_tick() if self._lockstep else asyncio.sleep(self._pause))
            writer.write(chunk(_delta(None, "length")))
            writer.write(chunk(_event({"choices": [], "usage": {
                "prompt_tokens": 20, "completion_tokens": tokens}})))
            writer.write(chunk(b"data: [DONE]\n\n"))
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    def _next_tick(self) -> asyncio.Future[None]:
        """The shared tick every stream waits for: the next decode step."""
        if self._tick is None or self._tick.done():
            loop = asyncio.get_running_loop()
            tick = self._tick = loop.create_future()
            loop.call_later(self._pause, tick.set_result, None)
        return self._tick


_NUMBERED = re.compile(r"_\d+$")  # a pool's `runner_3`: one kind with its siblings


def _thread_counters(group: int) -> dict[tuple[str, str], tuple[int, int]]:
    """CPU ticks and voluntary switches of every live thread of process group `group`,
    by (pid/tid, the thread's kind: its kernel name, numbering dropped, or `main`)."""
    counters: dict[tuple[str, str], tuple[int, int]] = {}
    for process, _ in group_stats(group):
        try:
            for thread in (process / "task").iterdir():
                head, tail = (thread / "stat").read_text().rsplit(")", 1)
                fields = tail.split()
                status = (thread / "status").read_text()
                switches = int(status.split("voluntary_ctxt_switches:")[1].split()[0])
                kind = ("main" if thread.name == process.name  # named as the process
                        else _NUMBERED.sub("_*", head.split("(", 1)[1]))
                counters[(f"{process.name}/{thread.name}", kind)] = (
                    int(fields[11]) + int(fields[12]), switches)
        except (OSError, IndexError):  # ended while we looked
            continue
    return counters


class Sampler:
    """The group's counters sampled every 0.2 s, so ended threads still count."""

    def __init__(self, group: int) -> None:
        self._group = group
        self._first = _thread_counters(group)
        self._last = dict(self._first)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self._last.update(_thread_counters(self._group))

    def totals(self) -> dict[str, tuple[float, int]]:
        """CPU seconds and voluntary switches since the start, by thread kind."""
        self._stop.set()
        self._thread.join()
        self._last.update(_thread_counters(self._group))
        ticks: Counter[str] = Counter()
        switches: Counter[str] = Counter()
        for key, (cpu, count) in self._last.items():
            first_cpu, first_count = self._first.get(key, (0, 0))
            ticks[key[1]] += cpu - first_cpu
            switches[key[1]] += count - first_count
        hertz = os.sysconf("SC_CLK_TCK")
        return {kind: (ticks[kind] / hertz, switches[kind]) for kind in ticks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rate", type=float, default=40.0)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--lockstep", action="store_true",
                        help="the streams with a slot send their tokens on one shared tick")
    args = parser.parse_args()
    upstream = StandIn(args.rate, args.slots, lockstep=args.lockstep)
    with tempfile.TemporaryDirectory() as scratch, pooled_client() as client:
        root = Path(scratch)
        children = Children(root / "logs")
        try:
            env = run_env(root, worker_concurrency=1, drain_seconds=1)
            assert run_command(env, "migrate").returncode == 0
            run_json(env, "models", "add-upstream", MODEL, "--base-url",
                     f"http://127.0.0.1:{upstream.port}/v1", "--upstream-model", "smollm2",
                     "--max-concurrency", "8")
            running = Runs(children).start(env)
            one = through_taskward(running.base_url, running.pair(), args.tokens,
                                   client)
            round_of(one, 1)  # warm-up: connections, the first claim
            sampler, started = Sampler(running.process.pid), time.perf_counter()
            for _ in range(args.rounds):
                round_of(one, args.streams)
            seconds = time.perf_counter() - started
            by_kind = sampler.totals()
        finally:
            children.kill_all()
    tokens = args.rounds * args.streams * args.tokens
    cpu = sum(kind_cpu for kind_cpu, _ in by_kind.values())
    switches = sum(count for _, count in by_kind.values())
    print(f"taskward at {args.streams} streams, {args.rate:.0f} tokens/s per slot: "
          f"{cpu * 1000 / tokens:.3f} CPU-ms and {switches / tokens:.2f} voluntary switches "
          f"per token ({cpu:.2f} CPU-s, {switches} switches, {tokens} tokens in {seconds:.1f} s; "
          f"load average {os.getloadavg()[0]:.1f})")
    for kind, (kind_cpu, count) in sorted(by_kind.items(), key=lambda item: -item[1][0]):
        if kind_cpu or count:
            print(f"  {kind:16} {kind_cpu * 1000 / tokens:.3f} CPU-ms per token "
                  f"({kind_cpu / cpu:.0%}), {count / tokens:.2f} voluntary switches")


if __name__ == "__main__":
    main()
