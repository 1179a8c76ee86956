"""Real-model figures of `taskward run` (SQLite) beside the bare batched loop, in one run.

Run from the repository root: `.venv/bin/python -m bench.service` (options: `--tokens`,
`--tasks 1,2,4,8`, `--runs`, `--ttfd`, `--threads` = TASKWARD_ENGINE_THREADS).

- Aggregate tokens/s of N concurrent greedy tasks in one `taskward run`
  (TASKWARD_WORKER_CONCURRENCY = the largest N), from the tasks' own event logs: first
  `response.loading` to the last terminal event, over all the tokens. The peer is the
  bare batched loop of `bench.engine` with N sequences in this process (the physical
  ceiling of this build here); service and peer take turns, best of `--runs` each.
- Two processes: two `taskward run`s on their own data directories, N tasks each at
  the same moment, against the first one alone with the same N.
- Time to first delta with 7 other tasks running: p50/p99 over `--ttfd` requests sent
  one after another while seven long tasks decode, from the 202 to the first
  `response.output_text.delta` frame on the SSE stream.
Every figure is printed with the load average at that moment: the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bench.engine import bare_batched, load_average
from core.engines.base import usable_cores
from core.engines.llama import init_backend
from core.engines.llama_native import llama_cpp
from core.model_files import DEFAULT_MODEL_ID, default_model_source
from tests.scheduler.processes import Children
from tests.service.running import Running, Runs, create, events, finished, run_env

BODY = {"input": "Tell a long story about a lighthouse keeper.", "temperature": 0}


def stamp(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["created_at"]).timestamp()


def burst(client: httpx.Client, tasks: int, tokens: int) -> tuple[float, int]:
    """Seconds from the first claim to the last completion of `tasks` tasks sent at
    once, and their output tokens, from the event logs."""
    ids = [create(client, **BODY, max_output_tokens=tokens)["id"] for _ in range(tasks)]
    for task_id in ids:
        assert finished(client, task_id, seconds=600)["status"] == "completed"
    starts, ends, generated = [], [], 0
    for task_id in ids:
        log = events(client, task_id)
        starts.append(next(stamp(e) for e in log if e["type"] == "response.loading"))
        ends.append(stamp(log[-1]))
        generated += log[-1]["data"]["response"]["usage"]["output_tokens"]
    return max(ends) - min(starts), generated


def rate(measured: tuple[float, int]) -> float:
    return measured[1] / measured[0]


def first_delta_ms(client: httpx.Client, tokens: int) -> float:
    created = client.post("/v1/responses", json={
        "model": DEFAULT_MODEL_ID, **BODY, "max_output_tokens": tokens})
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


def start(runs: Runs, data_dir: Path, args: argparse.Namespace,
          concurrency: int) -> tuple[Running, httpx.Client]:
    running = runs.start(run_env(data_dir, worker_concurrency=concurrency,
                                 engine_threads=args.threads))
    client = running.client(running.pair())
    warm = create(client, **BODY, max_output_tokens=4)["id"]  # loads the model
    assert finished(client, warm)["status"] == "completed"
    return running, client


def aggregate(client: httpx.Client, bare_model: llama_cpp.LlamaModel,
              args: argparse.Namespace) -> dict[int, float]:
    by_tasks: dict[int, float] = {}
    for n in args.task_counts:
        service, bare = [], []
        for _ in range(args.runs):
            service.append(rate(burst(client, n, args.tokens)))
            bare.append(rate(bare_batched(bare_model, args.threads, n, args.tokens)))
        by_tasks[n] = max(service)
        print(f"{n} concurrent tasks: service {max(service):6.1f} tok/s "
              f"(median {statistics.median(service):5.1f})   bare batched loop "
              f"{max(bare):6.1f} (median {statistics.median(bare):5.1f})   ratio "
              f"{max(service) / max(bare):.2f}   ({load_average()})", flush=True)
    return by_tasks


def two_processes(client_a: httpx.Client, client_b: httpx.Client, args: argparse.Namespace,
                  tasks: int) -> None:
    alone = max(rate(burst(client_a, tasks, args.tokens)) for _ in range(args.runs))
    together: list[float] = []
    for _ in range(args.runs):
        results: list[tuple[float, int]] = []
        threads = [threading.Thread(target=lambda c=c: results.append(burst(c, tasks,
                                                                            args.tokens)))
                   for c in (client_a, client_b)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        together.append(sum(rate(r) for r in results))
    print(f"two taskward processes, {tasks} task(s) each at once: {max(together):6.1f} tok/s "
          f"in all   one process alone: {alone:6.1f}   ratio {max(together) / alone:.2f}   "
          f"({load_average()})", flush=True)


def ttfd_beside_seven(client: httpx.Client, args: argparse.Namespace) -> None:
    others = [create(client, **BODY, max_output_tokens=args.long_tokens)["id"]
              for _ in range(7)]
    time.sleep(1.0)  # the seven are claimed and decoding
    samples = [first_delta_ms(client, 4) for _ in range(args.ttfd)]
    still = sum(client.get(f"/v1/tasks/{t}").json()["status"] == "running" for t in others)
    for task_id in others:
        finished(client, task_id, seconds=600)
    print(f"first delta with 7 others running: p50 {percentile(samples, 0.5):.0f} ms, "
          f"p99 {percentile(samples, 0.99):.0f} ms ({args.ttfd} requests; {still} of 7 "
          f"still running at the end)   ({load_average()})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--long-tokens", type=int, default=512,
                        help="tokens of each of the 7 tasks running during the ttfd probe")
    parser.add_argument("--tasks", default="1,2,4,8")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--ttfd", type=int, default=10)
    parser.add_argument("--threads", type=int, default=usable_cores())
    parser.add_argument("--skip", default="", help="comma list of: aggregate,two,ttfd")
    args = parser.parse_args()
    args.task_counts = [int(n) for n in args.tasks.split(",")]
    skip = set(args.skip.split(","))
    concurrency = max(8, *args.task_counts)
    print(f"{args.tokens} tokens per task, greedy, {args.threads} engine threads, "
          f"TASKWARD_WORKER_CONCURRENCY={concurrency}, best of {args.runs}, SQLite; "
          f"{load_average()}; OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, "
          f"GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT')}")
    init_backend()  # before any model: it picks the CPU variant (AVX2, ...)
    bare_model = llama_cpp.LlamaModel(str(default_model_source()), llama_cpp.LlamaModelParams())
    with tempfile.TemporaryDirectory(prefix="bench-service-") as tmp:
        children = Children(Path(tmp) / "logs")
        runs = Runs(children)
        try:
            running_a, client_a = start(runs, Path(tmp) / "a", args, concurrency)
            if "aggregate" not in skip:
                aggregate(client_a, bare_model, args)
            if "ttfd" not in skip:
                ttfd_beside_seven(client_a, args)
            if "two" not in skip:
                running_b, client_b = start(runs, Path(tmp) / "b", args, concurrency)
                for tasks in (1, 4):
                    two_processes(client_a, client_b, args, tasks)
                running_b.kill9()
            running_a.kill9()
        finally:
            children.kill_all()


if __name__ == "__main__":
    main()
