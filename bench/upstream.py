"""taskward in front of llama.cpp's llama-server, beside llama-server called directly, in
one run.

Run from the repository root: `.venv/bin/python -m bench.upstream` (options: `--levels
1,4,8`, `--tokens 128`, `--rounds 2`, `--threads 2`, `--parallel 4`, `--nice 0`,
`--idle`, `--server-cores N`, `--count-commits`, `--stages`, `--flush-interval-ms N`).
About 2 minutes on 2 shared cores.

`--flush-interval-ms N` runs taskward with `TASKWARD_FLUSH_INTERVAL_MS=N` instead of its
default: ~40 % of a streamed token's CPU follows the flush rate (docs/benchmarks.md,
"Thirty-third wave"), so this shows what that CPU costs the server beside it. A stream's
first text is still written `scheduler.output.FIRST_FLUSH_MS` after it came.

`--server-cores N` gives llama-server N cores of its own (and N threads), and the bench
and taskward the others: the server as on a machine of its own, which is where a
deployment runs it, so that what taskward's path costs a stream is measured apart from
what sharing the server's cores costs the server.

One `llama-server --parallel 4` (the default SmolLM2 model, greedy) serves both sides.
At each concurrency level, a round sends that many streaming requests at once:
- direct: Chat Completions with `stream: true` to llama-server;
- through taskward: `POST /v1/responses` (`background: false, stream: true`) to a
  `taskward run` on SQLite whose model is an upstream entry for that server
  (`max_concurrency` 8, so the server queues beyond its 4 slots as it does directly).
Direct and taskward rounds alternate; per level the best aggregate tokens/s and the p50
time to the first text delta (from sending the request) of all rounds are printed, and
for a level above the server's slots the p50s of the streams given a slot at once and
of those it queued, apart (the level's p50 is the midpoint between the two groups),
and the queued ones' less the time the server spent decoding the first group's tokens
in their round (`queued_less_decode_line`: a queued stream's wait is mostly that time,
which moves by a second between neighbouring rounds of either side).
Per level, too, the ratio of each taskward round over the direct round before it
(`pair_line`: the server's decode speed swings from round to round, so the best
rounds may come from different minutes); where the taskward side's streams spent
their time to the first delta (`stage_line`: stored, claimed, first text written, at
the client), from the client's clock and the task's row and log, so that the
difference is not only a total; with `--stages`, `taskward run` is started through
`bench.first_delta_probe`, which stamps the steps between the claim and the first
delta's commit, and a finer line follows for the streams given a slot at once
(`first_delta_line`: the claimer's call entered and returned, runner, engine thread,
request handed to the transport, its first read, the runner's first text, its first
write begun and committed); and llama-server's own decode time per token while it
served each side (its log's `eval time` of each request): how much the server itself
slowed beside taskward's processes, apart from what taskward's path adds.
The store's write load at the highest level: events per generated token and per
second from the event log, and with `--count-commits` the write transactions too, every
one that any taskward process committed (tasks created, claims, flushes, lease renewals,
completions), counted from their file syncs with `taskward run` started under `perf
trace` (`bench/commits.py`). The tracer's own CPU is left out of taskward's, but it does
take some from the shared cores, so the ratios of such a run are not the ones to judge by.
So does taskward's CPU time per generated token and per second (user + system of
every process of the `taskward run`, from /proc, over that level's taskward rounds): at
8 streams every CPU second of taskward's is one the saturated llama-server does not
get. Unlike a ratio, CPU time is not stretched by waiting for a core; much of it goes
per second (flushes every interval, ticks) rather than per token, though, so compare
per-token figures of runs whose token rates are alike.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
from sqlalchemy import create_engine, func, select

from bench import commits, first_delta_probe
from bench.steal import Steal, percents
from core.tables import task_events, tasks
from tests.scheduler.processes import Children, run_command, run_json
from tests.service.running import Runs, run_env
from tests.upstream.llama import LlamaServer

PROMPT = [{"role": "system", "content": "You are a storyteller."},
          {"role": "user", "content": "Tell a long story about a lighthouse keeper."}]
MODEL = "smol-upstream"


@dataclass(frozen=True)
class Stream:
    first_delta_s: float
    seconds: float
    tokens: int
    task_id: str | None = None  # through taskward: the task, from `response.created`
    sent_at: float = 0.0  # `time.time()` as the request was sent, for `stage_line`


def pooled_client() -> httpx.Client:
    """One side's client, shared by its streams and kept across rounds, as a client of
    either server would keep its connections: a new `httpx.Client` per stream cost
    ~22 ms of CPU (its TLS context), eight at once ~110-135 ms before the first was
    ready, on both sides and beside the server under test."""
    return httpx.Client(timeout=300, limits=httpx.Limits(max_connections=64,
                                                         max_keepalive_connections=64))


def direct(server: LlamaServer, tokens: int, client: httpx.Client) -> Callable[[], Stream]:
    body = {"model": "smollm2", "messages": PROMPT, "stream": True, "temperature": 0,
            "max_tokens": tokens, "stream_options": {"include_usage": True}}

    def one() -> Stream:
        start = time.perf_counter()
        first, used = None, 0
        with client.stream("POST", f"{server.base_url}/chat/completions",
                           json=body) as answer:
            for line in answer.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    used = chunk["usage"]["completion_tokens"]
                if first is None and chunk.get("choices") and (
                        chunk["choices"][0]["delta"].get("content")):
                    first = time.perf_counter()
        assert first is not None
        return Stream(first - start, time.perf_counter() - start, used)

    return one


def through_taskward(base_url: str, token: str, tokens: int, client: httpx.Client,
                     kept: list[Stream] | None = None) -> Callable[[], Stream]:
    """One stream through `POST /v1/responses`; each is also appended to `kept`."""
    body = {"model": MODEL, "input": PROMPT, "temperature": 0, "max_output_tokens": tokens,
            "background": False, "stream": True}
    headers = {"Authorization": f"Bearer {token}"}

    def one() -> Stream:
        sent_at, start = time.time(), time.perf_counter()
        first, used, event, task_id = None, 0, "", None
        with client.stream("POST", f"{base_url}/v1/responses", json=body,
                           headers=headers) as answer:
            for line in answer.iter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: "):
                    if event == "response.output_text.delta" and first is None:
                        first = time.perf_counter()
                    elif event == "response.created":
                        task_id = json.loads(line[6:])["response"]["id"]
                    elif event == "response.completed":
                        used = json.loads(line[6:])["response"]["usage"]["output_tokens"]
        assert first is not None
        stream = Stream(first - start, time.perf_counter() - start, used, task_id, sent_at)
        if kept is not None:
            kept.append(stream)
        return stream

    return one


def round_of(one: Callable[[], Stream], concurrency: int) -> tuple[float, list[float]]:
    """Aggregate tokens/s of `concurrency` streams started together, and their TTFTs."""
    results: list[Stream] = []
    lock = threading.Lock()

    failures: list[BaseException] = []

    def run() -> None:
        try:
            stream = one()
        except BaseException as exc:  # reported below, with the others
            failures.append(exc)
            return
        with lock:
            results.append(stream)

    start = time.perf_counter()
    threads = [threading.Thread(target=run) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    assert not failures, f"{len(failures)} stream(s) failed: {failures[0]!r}"
    return sum(r.tokens for r in results) / wall, [r.first_delta_s for r in results]


def pair_line(level: int, rates: dict[str, list[float]]) -> str:
    """The tokens/s ratio of each round through taskward over the direct round just
    before it: the server's decode speed swings from round to round on shared cores
    (docs/benchmarks.md, "Why the ratio at four streams moves"), and the table's best round
    of each side takes whichever side drew the faster rounds; neighbouring rounds
    share more of the machine's state."""
    ratios = [ours / theirs for theirs, ours in zip(rates["direct"], rates["taskward"],
                                                   strict=True)]
    return (f"{level} streams, tokens/s ratio of each round through taskward over the "
            f"direct round before it: {', '.join(f'{r:.2f}' for r in ratios)} "
            f"(median {statistics.median(ratios):.2f})")


def steal_line(level: int, stolen: dict[str, list[float]]) -> str:
    """The CPU the hypervisor took from this VM during each round (`bench.steal`): a
    round it slowed is no figure of taskward's."""
    return (f"{level} streams, CPU stolen by the hypervisor per round: " + "; ".join(
        f"{name} {percents(shares)}"
        for name, shares in stolen.items()))


def queued_line(level: int, parallel: int, firsts: dict[str, list[list[float]]]) -> str:
    """Above the server's slots, a level's p50 first delta is the midpoint between the
    streams that got a slot at once and those the server queued until one freed, and
    moves with either group's edge: the two groups' own p50s, side by side. A round's
    `parallel` quickest first deltas count as the first group."""
    (direct_now, direct_queued), (ours_now, ours_queued) = (
        halves_ms(firsts["direct"], parallel), halves_ms(firsts["taskward"], parallel))
    return (f"{level} streams, first delta p50 of the {parallel} per round given a slot at "
            f"once: direct {direct_now:.0f} ms, taskward {ours_now:.0f} ms "
            f"({ours_now - direct_now:+.0f}); of the {level - parallel} queued: direct "
            f"{direct_queued:.0f} ms, taskward {ours_queued:.0f} ms "
            f"({ours_queued - direct_queued:+.0f})")


def queued_less_decode_line(level: int, parallel: int, firsts: dict[str, list[list[float]]],
                            first_decode_ms: dict[str, list[float | None]]) -> str:
    """A queued stream waits until a slot's request has generated all its tokens, so its
    first delta moves with the server's decode speed of its round times the tokens asked
    for: 128 tokens at 30 or at 40 ms each, which neighbouring rounds of either side
    drew (seen here), move it by 1.3 s. Less the time the server spent decoding the
    first group's tokens in the same round (its own log; None: the round's lines did
    not all come), what is left is the rest of the wait (the first group's arrival and
    prompt, the queued one's prompt, the path through taskward), comparable between
    rounds of different speeds. A round's streams all lose the same time, so the same
    ones stay queued (`halves_ms`). A side with no round whose lines all came has no
    figure, and the line says so."""
    less_decode = {name: [[v - decoded / 1000 for v in ttfts]
                          for ttfts, decoded in zip(rounds, first_decode_ms[name],
                                                    strict=True)
                          if decoded is not None]
                   for name, rounds in firsts.items()}
    if not all(less_decode.values()):
        return (f"{level} streams, queued less decode: on one side no round had the "
                "server's log line of every request")
    left = {name: halves_ms(rounds, parallel)[1] for name, rounds in less_decode.items()}
    return (f"{level} streams, first delta p50 of the {level - parallel} queued, less the "
            f"server's decode of the first {parallel}'s tokens in their round: direct "
            f"{left['direct']:.0f} ms, taskward {left['taskward']:.0f} ms "
            f"({left['taskward'] - left['direct']:+.0f})")


def halves_ms(rounds: list[list[float]], parallel: int) -> tuple[float, float]:
    """The p50 first delta, in ms, of each round's `parallel` quickest streams and of the
    rest: above the server's slots, those it gave a slot at once and those it queued."""
    ordered = [sorted(ttfts) for ttfts in rounds]
    return (statistics.median(v for o in ordered for v in o[:parallel]) * 1000,
            statistics.median(v for o in ordered for v in o[parallel:]) * 1000)


# llama-server's own timing of a request's generation, printed as the request ends
# ("... |        eval time =  3120.52 ms /   128 tokens (...)"; the prompt's line before
# it says "prompt eval time").
_DECODE_TIMING = re.compile(rb"\|\s+eval time =\s+([\d.]+) ms /\s+(\d+) tokens")


def decode_ms_per_token(log: Path, start: int, expected: int) -> tuple[list[float], int]:
    """The server's own milliseconds per generated token of each request it finished
    after byte `start` of its log (waiting a moment for `expected` of them: a request's
    line may come just after its stream ended), and where the lines read end. A slot's
    decode slows when another process takes one of the cores its threads compute on, so
    a side whose figure is higher cost the server time, whatever its own path adds."""
    deadline = time.monotonic() + 2
    while True:
        with log.open("rb") as file:
            file.seek(start)
            written = file.read()
        written = written[:written.rfind(b"\n") + 1]  # whole lines only
        found = _DECODE_TIMING.findall(written)
        if len(found) >= expected or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    timings = [float(ms) / int(tokens) for ms, tokens in found if int(tokens)]
    return timings, start + len(written)


def decode_line(level: int, decode: dict[str, list[float]]) -> str:
    p50 = {name: statistics.median(values) for name, values in decode.items()}
    return (f"{level} streams, llama-server's own decode (p50 of its requests' "
            f"`eval time`): direct {p50['direct']:.1f} ms per token, while serving taskward "
            f"{p50['taskward']:.1f} ({p50['taskward'] / p50['direct'] - 1:+.0%})")


def stage_line(level: int, logged: list[dict[str, float]], direct_ttfts: list[float]) -> str:
    """Where a level's streams through taskward spent their time to the first delta, from
    the client's clock and the task's row and log (millisecond stamps, so each stage is
    +-1 ms): the POST until the task is stored (`created_at`), until it is claimed
    (`started_at`), until its first text is written (the first delta event's stamp, taken
    as its flush begins; the upstream's own time to its first token lies inside, the
    direct side's p50 is printed beside it), and from that write to the client
    (`logged`: each stream's `logged_stamps`)."""
    stages: dict[str, list[float]] = {name: [] for name in (
        "sent -> stored", "stored -> claimed", "claimed -> first text written",
        "written -> client")}
    for stamped in logged:
        marks = [stamped[name] for name in ("sent", "stored", "claimed", "written", "client")]
        for name, before, after in zip(stages, marks, marks[1:], strict=False):
            stages[name].append(after - before)
    parts = ", ".join(f"{name} {statistics.median(values):.1f}"
                      for name, values in stages.items())
    return (f"{level} streams through taskward, p50 ms: {parts} (direct first delta p50 "
            f"{statistics.median(direct_ttfts) * 1000:.0f})")


def logged_stamps(database: Path, streams: list[Stream]) -> list[dict[str, float]]:
    """Each stream's epoch milliseconds: sent and at the client (the client's clock),
    stored and claimed (the task's row), its first text written (the first delta event's
    stamp, taken as its flush begins)."""
    engine = create_engine(f"sqlite:///{database}")
    stamped: list[dict[str, float]] = []
    with engine.connect() as conn:
        for stream in streams:
            stored_ms, claimed_ms = conn.execute(
                select(tasks.c.created_at, tasks.c.started_at)
                .where(tasks.c.id == stream.task_id)).one()
            written_ms = conn.execute(
                select(func.min(task_events.c.created_at))
                .where(task_events.c.task_id == stream.task_id,
                       task_events.c.type == "response.output_text.delta")).scalar_one()
            stamped.append({"sent": stream.sent_at * 1000, "stored": stored_ms,
                            "claimed": claimed_ms, "written": written_ms,
                            "client": (stream.sent_at + stream.first_delta_s) * 1000})
    engine.dispose()
    return stamped


def first_delta_line(level: int, given: int, streams: list[Stream],
                     logged: list[dict[str, float]], probed: Path) -> str:
    """Where the streams given a slot at once (the quickest `given` of each round's
    `level`) spent their time to the first delta: the p50, over those streams, of each
    step's milliseconds after the send, from the task's row (`logged`: each stream's
    `logged_stamps`) and the probe's stamps (`bench.first_delta_probe`) to the client's
    first delta."""
    paired = list(zip(streams, logged, strict=True))  # `level` a round, round after round
    quickest = [pair for start in range(0, len(paired), level)
                for pair in sorted(paired[start:start + level],
                                   key=lambda pair: pair[0].first_delta_s)[:given]]
    probe_stamps = first_delta_probe.read(probed)
    steps: dict[str, list[float]] = {}
    waits: list[float] = []
    # In time order: the log's `claimed` (the lease's stamp) falls inside the claim's call.
    order = ["stored", *first_delta_probe.STAGES, "client"]
    order.insert(order.index("claim returned"), "claimed")
    for stream, row in quickest:
        assert stream.task_id is not None
        # The row's own `written` (the delta event's stamp) is the probe's `write begun`.
        stamped = {**probe_stamps.get(stream.task_id, {}),
                   **{step: row[step] for step in ("stored", "claimed", "client")}}
        for step in order:
            if step in stamped:
                steps.setdefault(step, []).append(stamped[step] - row["sent"])
        if first_delta_probe.WAITED in stamped:
            waits.append(stamped[first_delta_probe.WAITED])
    parts = ", ".join(f"{step} {statistics.median(values):.1f}" for step, values in steps.items())
    waited = f"; the first write {statistics.median(waits):.1f} of it runnable without a CPU" \
        if waits else ""
    return (f"{level} streams through taskward, the {min(level, given)} per round given a "
            f"slot at once, p50 ms after the send: {parts}{waited}")


@dataclass(frozen=True)
class Round:
    """One taskward round: its start on the wall clock (the event log's), its start and
    end on the monotonic clock, and the tokens it streamed."""

    since_ms: int
    started: float
    ended: float
    tokens: int

    @property
    def seconds(self) -> float:
        return self.ended - self.started


def write_load(database: Path, span: Round, committed: commits.Commits | None) -> str:
    """Events the taskward side stored in `span`, and the transactions it committed
    when they were counted."""
    engine = create_engine(f"sqlite:///{database}")
    with engine.connect() as conn:
        events = conn.execute(select(func.count()).select_from(task_events)
                              .where(task_events.c.created_at >= span.since_ms)).scalar_one()
    engine.dispose()
    tokens, seconds = span.tokens, span.seconds
    line = (f"{events} events for {tokens} tokens: {events / tokens:.2f} per token, "
            f"{events / seconds:.0f}/s")
    if committed is None:
        return f"{line} (write transactions: run with --count-commits)"
    low, high = committed.fewest, committed.most
    return (f"{line}; {low}-{high} write transactions: {low / tokens:.3f}-{high / tokens:.3f} "
            f"per token, {low / seconds:.1f}-{high / seconds:.1f}/s")


def group_stats(group: int, *, besides: int | None = None) -> list[tuple[Path, list[str]]]:
    """Each live process of process group `group` but `besides` (a tracer): its /proc
    folder and its stat fields after the command name."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        if stat.parent.name == str(besides):
            continue
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended while we looked
            continue
        if int(fields[2]) == group:
            found.append((stat.parent, fields))
    return found


def cpu_seconds(group: int, *, besides: int | None = None) -> float:
    """User + system CPU seconds so far of the live processes of process group `group`,
    but for process `besides` (a tracer)."""
    tick = os.sysconf("SC_CLK_TCK")
    return sum(int(fields[11]) + int(fields[12])
               for _, fields in group_stats(group, besides=besides)) / tick


def start_server(folder: Path, *, parallel: int, threads: int,
                 server_cores: int) -> LlamaServer:
    """The llama-server both sides are measured against; with `server_cores`, pinned to
    that many cores of its own (its threads inherit the pin it starts with), and this
    process, with whatever it starts later, to the others."""
    cores = sorted(os.sched_getaffinity(0))
    if not 0 <= server_cores < len(cores):
        raise SystemExit(f"--server-cores must leave at least one of the {len(cores)} cores")
    split = len(cores) - server_cores
    if server_cores:
        os.sched_setaffinity(0, cores[split:])
    server = LlamaServer(folder, parallel=parallel, threads=threads,
                         ctx_size=1024 * parallel).start()
    if server_cores:
        os.sched_setaffinity(0, cores[:split])
        print(f"llama-server on cores {cores[split:]} with {threads} thread(s); the "
              f"bench and taskward on {cores[:split]}")
    return server


def deprioritise(group: int, *, niceness: int, idle: bool) -> None:
    """Every thread of process group `group` at `niceness`, or under `SCHED_IDLE` (run
    only on a core nothing else wants, and never preempting what runs there). Linux
    keeps both per thread and a new thread takes its creator's, so threads started
    later (an attempt's engine thread) inherit them."""
    for folder, _ in group_stats(group):
        for thread in (folder / "task").iterdir():
            try:
                if idle:
                    os.sched_setscheduler(int(thread.name), os.SCHED_IDLE, os.sched_param(0))
                else:
                    os.setpriority(os.PRIO_PROCESS, int(thread.name), niceness)
            except ProcessLookupError:  # ended while we looked
                continue


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--levels", default="1,4,8")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--parallel", type=int, default=4)
    priority = parser.add_mutually_exclusive_group()  # SCHED_IDLE has no niceness
    priority.add_argument("--nice", type=int, default=0,
                          help="run taskward at this niceness (0: as the bench and the server)")
    priority.add_argument("--idle", action="store_true",
                          help="run taskward under SCHED_IDLE: on cores the server leaves idle")
    parser.add_argument("--server-cores", type=int, default=0,
                        help="pin llama-server (with as many threads) to this many cores of "
                             "its own, the bench and taskward to the others")
    parser.add_argument("--count-commits", action="store_true",
                        help="run taskward under `perf trace` to count its write transactions")
    parser.add_argument("--flush-interval-ms", type=int, default=0,
                        help="run taskward with this flush interval (0: its default)")
    parser.add_argument("--stages", action="store_true",
                        help="run taskward through bench.first_delta_probe and print where "
                        "the streams given a slot at once spent their time to the first delta")
    args = parser.parse_args()
    levels = [int(level) for level in args.levels.split(",")]
    print(f"load average before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        server = start_server(root / "llama", parallel=args.parallel,
                              threads=args.server_cores or args.threads,
                              server_cores=args.server_cores)
        children = Children(root / "logs")
        clients = {name: pooled_client() for name in ("direct", "taskward")}
        try:
            flush = {"flush_interval_ms": args.flush_interval_ms} if args.flush_interval_ms else {}
            env = run_env(root, worker_concurrency=1, drain_seconds=1, **flush)
            assert run_command(env, "migrate").returncode == 0
            run_json(env, "models", "add-upstream", MODEL, "--base-url", server.base_url,
                     "--upstream-model", "smollm2", "--max-concurrency", "8")
            trace = root / "syncs.trace" if args.count_commits else None
            probed = root / "stages.txt" if args.stages else None
            wrapper = [*(commits.traced(trace) if trace else ()),
                       *((sys.executable, "-m", "bench.first_delta_probe") if probed else ())]
            if probed:
                env["BENCH_STAGES_OUT"] = str(probed)
            running = Runs(children).start(env, wrapper=wrapper)
            tracer = running.process.pid if trace else None
            if args.nice or args.idle:
                deprioritise(running.process.pid, niceness=args.nice, idle=args.idle)
            token = running.pair()
            kept: list[Stream] = []  # the taskward side's streams of the current level
            sides = {"direct": direct(server, args.tokens, clients["direct"]),
                     "taskward": through_taskward(running.base_url, token, args.tokens,
                                                  clients["taskward"], kept)}
            for one in sides.values():
                round_of(one, 1)  # warm-up: prompt cache, connections, the first claim
            print("| concurrency | direct tokens/s | taskward tokens/s | ratio | "
                  "direct TTFT p50 ms | taskward TTFT p50 ms | difference ms |")
            print("|---|---|---|---|---|---|---|")
            cpu, cpu_tokens, cpu_wall = 0.0, 0, 0.0
            queued_lines: list[str] = []
            stage_lines: list[str] = []
            pair_lines: list[str] = []
            decode_lines: list[str] = []
            _, log_at = decode_ms_per_token(server.log_path, 0, len(sides))  # the warm-ups
            for level in levels:
                kept.clear()
                decode: dict[str, list[float]] = {name: [] for name in sides}
                rates: dict[str, list[float]] = {name: [] for name in sides}
                firsts: dict[str, list[list[float]]] = {name: [] for name in sides}
                stolen: dict[str, list[float]] = {name: [] for name in sides}
                # Per round, the ms the server spent decoding the tokens of the requests
                # it finished first (the first group above its slots): their mean per
                # token times the tokens each was asked for.
                first_decode: dict[str, list[float | None]] = {name: [] for name in sides}
                for _ in range(args.rounds):
                    for name, one in sides.items():
                        if name == "taskward" and level == levels[-1]:
                            since_ms, started = int(time.time() * 1000), time.monotonic()
                            cpu_before = cpu_seconds(running.process.pid, besides=tracer)
                        steal = Steal()
                        rate, ttfts = round_of(one, level)
                        stolen[name].append(steal.percent())
                        timings, log_at = decode_ms_per_token(server.log_path, log_at, level)
                        decode[name] += timings
                        first_decode[name].append(
                            statistics.mean(timings[:args.parallel]) * args.tokens
                            if len(timings) >= level else None)
                        rates[name].append(rate)
                        firsts[name].append(ttfts)
                        if name == "taskward" and level == levels[-1]:
                            ended = time.monotonic()
                            last = Round(since_ms, started, ended, int(rate * (ended - started)))
                            cpu += (cpu_seconds(running.process.pid, besides=tracer)
                                    - cpu_before)
                            cpu_tokens += last.tokens
                            cpu_wall += last.seconds
                best = {name: max(values) for name, values in rates.items()}
                p50 = {name: statistics.median(v for ttfts in rounds for v in ttfts) * 1000
                       for name, rounds in firsts.items()}
                print(f"| {level} | {best['direct']:.0f} | {best['taskward']:.0f} | "
                      f"{best['taskward'] / best['direct']:.2f} | {p50['direct']:.0f} | "
                      f"{p50['taskward']:.0f} | {p50['taskward'] - p50['direct']:+.0f} |")
                pair_lines.append(pair_line(level, rates))
                pair_lines.append(steal_line(level, stolen))
                if level > args.parallel:
                    queued_lines.append(queued_line(level, args.parallel, firsts))
                    queued_lines.append(queued_less_decode_line(level, args.parallel, firsts,
                                                                first_decode))
                logged = logged_stamps(root / "taskward.db", kept)
                stage_lines.append(stage_line(level, logged,
                                              [v for ttfts in firsts["direct"] for v in ttfts]))
                if probed:
                    stage_lines.append(first_delta_line(level, args.parallel, kept, logged,
                                                        probed))
                decode_lines.append(decode_line(level, decode))
            for line in pair_lines + queued_lines + stage_lines + decode_lines:
                print(line)
            committed = None  # in `last`, the last round at the top level
            if trace:
                files = commits.SyncFiles.read(  # while the processes still run
                    [folder for folder, _ in group_stats(running.process.pid,
                                                          besides=tracer)],
                    (root / "taskward.db").resolve())
                commits.stop(running.process)  # its last lines written out
                committed = commits.count(trace, files, last.started, last.ended)
            print(f"store write load at {levels[-1]} streams (last round): "
                  f"{write_load(root / 'taskward.db', last, committed)}")
            print(f"taskward CPU at {levels[-1]} streams: {cpu * 1000 / cpu_tokens:.2f} CPU-ms "
                  f"per generated token ({cpu:.2f} CPU-s for {cpu_tokens} tokens in "
                  f"{cpu_wall:.1f} s, {cpu / cpu_wall:.3f} CPU-s/s; load average "
                  f"{os.getloadavg()[0]:.1f})")
        finally:
            for client in clients.values():
                client.close()
            children.kill_all()
            server.kill9()
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
