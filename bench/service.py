"""Real-model figures of `taskward run` (SQLite) beside the bare engine, in one run.

Run from the repository root: `.venv/bin/python -m bench.service` (options: `--runs`,
`--tasks`, `--tokens`, `--ttfd`, `--threads` = TASKWARD_ENGINE_THREADS on both sides,
`--concurrency 1,2`). About 4-5 minutes on 2 shared cores.

- Tokens/s of one greedy task (128 tokens), and the aggregate tokens/s of a burst of
  concurrent tasks (default 6) with TASKWARD_WORKER_CONCURRENCY=1 and =2. The service
  figure is the task's own window in its event log (`response.loading` to the terminal
  event: digest check, model cache, context, prompt, tokens, flushes, the final
  write); the peer is the same generation on the bare engine in this process
  (`bench.engine.engine_run`), each on a fresh thread as the worker does, with as many
  generations at once as the service runs. Service and peer take turns (the peer runs
  while the service idles); the best and the median of `--runs` are printed for each
  and the overhead is taken between the bests: the machine is shared.
- Time to the first delta event from the 202 (p50/p99 over `--ttfd` sequential requests
  with a warm model), as a client sees it: the SSE stream is opened right after the
  202 and the clock stops when the first `response.output_text.delta` frame arrives.
- RSS of the `taskward run` processes with the model loaded (/proc VmRSS and VmHWM).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bench.engine import MESSAGES, engine_run
from core.engines.base import EngineOptions, GenerationRequest, ModelFile
from core.engines.llama import LlamaEngine, LlamaLoadedModel
from core.model_files import DEFAULT_MODEL_ID, default_model_source, sha256_of
from core.settings import Settings
from tests.scheduler.processes import Children
from tests.service.running import Running, Runs, create, events, finished, run_env

SERVICE_BODY = {"input": MESSAGES, "temperature": 0}


def stamp(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["created_at"]).timestamp()


def task_window(client: httpx.Client, task_id: str) -> tuple[float, float, int]:
    """(claimed at, finished at, output tokens) of a completed task, from its log."""
    log = events(client, task_id)
    assert log[-1]["type"] == "response.completed", log[-1]["type"]
    claimed = next(stamp(e) for e in log if e["type"] == "response.loading")
    tokens = log[-1]["data"]["response"]["usage"]["output_tokens"]
    return claimed, stamp(log[-1]), tokens


def service_burst(client: httpx.Client, tasks: int, tokens: int) -> tuple[float, int]:
    """Seconds from the first claim to the last completion of `tasks` tasks sent at
    once, and their output tokens."""
    ids = [create(client, **SERVICE_BODY, max_output_tokens=tokens)["id"]
           for _ in range(tasks)]
    for task_id in ids:
        assert finished(client, task_id, seconds=600)["status"] == "completed"
    windows = [task_window(client, task_id) for task_id in ids]
    return (max(w[1] for w in windows) - min(w[0] for w in windows),
            sum(w[2] for w in windows))


def bare_burst(model: LlamaLoadedModel, tasks: int, tokens: int,
               concurrency: int) -> tuple[float, int]:
    """The same burst on the bare engine, called the way the worker calls it: every
    generation on a fresh thread, at most `concurrency` at once.

    The threading matters: llama.cpp runs on OpenMP, which keeps a thread team per
    calling thread, and decode speed on 2 cores swings with how many teams are alive
    (here, once the main thread had generated, generations on other threads ran ~2.5x
    slower than on fresh threads alone).
    """
    request = GenerationRequest(MESSAGES, max_output_tokens=tokens)
    slots = threading.Semaphore(concurrency)
    results: list[tuple[float, float, int]] = []

    def one() -> None:
        try:
            results.append(engine_run(model, request))
        finally:
            slots.release()

    started = time.perf_counter()
    threads = []
    for _ in range(tasks):
        slots.acquire()
        threads.append(threading.Thread(target=one))
        threads[-1].start()
    for thread in threads:
        thread.join()
    assert len(results) == tasks
    return time.perf_counter() - started, sum(r[2] for r in results)


Measure = Callable[[], tuple[float, int]]  # seconds, tokens


@dataclass(frozen=True)
class Rates:
    best: float
    median: float
    tokens: int  # generated in the best run


def rates(measured: list[tuple[float, int]]) -> Rates:
    per_run = [tokens / seconds for seconds, tokens in measured]
    best = max(range(len(measured)), key=per_run.__getitem__)
    return Rates(per_run[best], statistics.median(per_run), measured[best][1])


def in_turns(service: Measure, bare: Measure, runs: int) -> tuple[Rates, Rates]:
    """Tokens/s of the service and of the bare engine, measured in turns."""
    results = [(service(), bare()) for _ in range(runs)]
    return rates([r[0] for r in results]), rates([r[1] for r in results])


def first_delta_ms(client: httpx.Client, tokens: int) -> float:
    created = client.post("/v1/responses", json={
        "model": DEFAULT_MODEL_ID, **SERVICE_BODY, "max_output_tokens": tokens})
    accepted = time.perf_counter()
    assert created.status_code == 202, created.text
    task_id = created.json()["id"]
    with client.stream("GET", f"/v1/tasks/{task_id}/events",
                       headers={"Accept": "text/event-stream"}) as stream:
        for line in stream.iter_lines():
            if line == "event: response.output_text.delta":
                seen = time.perf_counter()
                break
        else:
            raise AssertionError("the stream ended without a delta")
    finished(client, task_id)
    return (seen - accepted) * 1000


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def rss_line(running: Running) -> str:
    """VmRSS (VmHWM) of `taskward run`: its granian supervisor and the worker process that
    serves the API, runs the sweeper and holds the model."""
    main = running.process.pid
    children = Path(f"/proc/{main}/task/{main}/children").read_text().split()
    parts, total = [], 0
    for pid, role in [(main, "supervisor"), *((int(c), "worker") for c in children)]:
        status = dict(line.split(":", 1) for line in
                      Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
        rss, hwm = (int(status[k].split()[0]) // 1024 for k in ("VmRSS", "VmHWM"))
        total += rss
        parts.append(f"{role} {rss} MiB (peak {hwm})")
    return f"{', '.join(parts)}; {total} MiB in all"


def measure_service(runs: Runs, data_dir: Path, concurrency: int, model: LlamaLoadedModel,
                    args: argparse.Namespace) -> None:
    """Every figure of one `taskward run` with TASKWARD_WORKER_CONCURRENCY=`concurrency`."""
    running = runs.start(run_env(data_dir, worker_concurrency=concurrency,
                                 engine_threads=args.threads))
    with running.client(running.pair()) as client:
        warm = create(client, **SERVICE_BODY, max_output_tokens=8)["id"]  # loads the model
        assert finished(client, warm)["status"] == "completed"
        if concurrency == 1:
            print(line("one task", in_turns(
                lambda: service_burst(client, 1, args.tokens),
                lambda: bare_burst(model, 1, args.tokens, 1), args.runs)))
        print(line(f"{args.tasks} tasks, concurrency {concurrency}", in_turns(
            lambda: service_burst(client, args.tasks, args.tokens),
            lambda: bare_burst(model, args.tasks, args.tokens, concurrency), args.runs)))
        if concurrency == 1:
            ttfd = [first_delta_ms(client, 8) for _ in range(args.ttfd)]
            print(f"first delta p50 {percentile(ttfd, 0.5):.0f} ms, "
                  f"p99 {percentile(ttfd, 0.99):.0f} ms after the 202 "
                  f"({args.ttfd} requests, warm model, SSE; target p50 < 300 ms)")
        print(f"rss after concurrency {concurrency}: {rss_line(running)}")
    running.kill9()


def line(name: str, measured: tuple[Rates, Rates]) -> str:
    service, bare = measured
    overhead = (1 - service.best / bare.best) * 100
    return (f"{name:26} service {service.best:5.1f} tokens/s (median {service.median:5.1f})   "
            f"bare engine {bare.best:5.1f} (median {bare.median:5.1f})   "
            f"overhead {overhead:+5.1f} %   ({service.tokens} tokens)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--tasks", type=int, default=6)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ttfd", type=int, default=20, help="requests for time to first delta")
    parser.add_argument("--threads", type=int,
                        default=Settings.model_fields["engine_threads"].default,
                        help="engine threads per task (TASKWARD_ENGINE_THREADS), both sides")
    parser.add_argument("--concurrency", default="1,2",
                        help="TASKWARD_WORKER_CONCURRENCY values to measure")
    args = parser.parse_args()

    threads = args.threads
    source = default_model_source()
    model = LlamaEngine(EngineOptions(threads=threads)).load(
        ModelFile(DEFAULT_MODEL_ID, source, sha256_of(source)))
    bare_burst(model, 1, 8, 1)  # warm, off the main thread like every later call
    print(f"model       {source.name}, {threads} engine threads per task, "
          f"best and median of {args.runs} runs, SQLite store")

    with tempfile.TemporaryDirectory(prefix="bench-service-") as tmp:
        children = Children(Path(tmp) / "logs")
        runs = Runs(children)
        try:
            for concurrency in (int(c) for c in args.concurrency.split(",")):
                measure_service(runs, Path(tmp) / f"c{concurrency}", concurrency, model, args)
        finally:
            children.kill_all()


if __name__ == "__main__":
    main()
