"""The llama.cpp engine against this machine's ceiling, in one run.

Run from the repository root: `.venv/bin/python -m bench.engine` (options: `--tokens`,
`--sequences 1,2,4,8`, `--threads`, `--seconds` per contention case, `--skip`).

- Ceiling: a bare batched greedy loop written here directly against `cyllama` (one
  context, N sequences, one `llama_decode` per token for all of them, no snapshots, no
  text assembly): what this build can do on these cores.
- Engine: N concurrent `generate` calls on one loaded model, each on its own thread as
  the worker runs them; they share the model's decode loop.
- Two processes: two child processes decoding one sequence each at the same time, for
  `--seconds`, beside one child alone; each reports tokens/s, CPU seconds per token and
  involuntary context switches. Cases: libgomp's long spin (the engine at first), one
  thread each, passive threads (the engine next), and the short spin (the default,
  `core/engines/llama_native.py`) without the host lock (the default) and with it
  (`TASKWARD_ENGINE_HOST_LOCK`, opt-in).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from core.engines.base import EngineOptions, GenerationRequest, ModelFile, usable_cores
from core.engines.llama import LlamaEngine, LlamaLoadedModel, apply_template, init_backend
from core.engines.llama_native import llama_cpp
from core.model_files import DEFAULT_MODEL_ID, default_model_source, sha256_of

PROMPTS = [
    "Tell a long story about a lighthouse keeper.",
    "Describe the city of Paris in spring.",
    "Write a poem about the rain in autumn.",
    "Explain how bread is baked.",
    "Tell a long story about a dragon who loves books.",
    "Describe a walk through a forest at dawn.",
    "Write a letter to a friend about a journey by train.",
    "Explain why the sky is blue.",
]
ROOT = Path(__file__).resolve().parents[1]


def messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]


def load_engine(threads: int, sequences: int, host_lock: Path | None) -> LlamaLoadedModel:
    source = default_model_source()
    engine = LlamaEngine(EngineOptions(threads=threads, sequences=sequences,
                                       host_lock=host_lock))
    return engine.load(ModelFile(DEFAULT_MODEL_ID, source, sha256_of(source)))


def bare_batched(model: llama_cpp.LlamaModel, threads: int, n_seq: int,
                 tokens: int) -> tuple[float, int]:
    """Seconds and tokens for `n_seq` greedy generations in one batched context, on a
    fresh thread as the engine's loop runs (each calling thread gets its own OpenMP
    team; a team left over from other work skews the figure)."""
    result: list[tuple[float, int]] = []
    thread = threading.Thread(target=lambda: result.append(
        _bare_batched(model, threads, n_seq, tokens)))
    thread.start()
    thread.join()
    return result[0]


def _bare_batched(model: llama_cpp.LlamaModel, threads: int, n_seq: int,
                  tokens: int) -> tuple[float, int]:
    vocab = model.get_vocab()
    prompts = [vocab.tokenize(apply_template(model, messages(i)), True, True)
               for i in range(n_seq)]
    params = llama_cpp.LlamaContextParams()
    params.n_ctx = sum(len(p) for p in prompts) + n_seq * tokens
    params.n_batch = params.n_ubatch = 512
    params.n_seq_max = n_seq
    params.kv_unified = True
    params.n_threads = params.n_threads_batch = threads
    params.no_perf = True
    start = time.perf_counter()
    ctx = llama_cpp.LlamaContext(model, params)
    batch = llama_cpp.LlamaBatch(n_tokens=512, embd=0, n_seq_max=n_seq)
    rows: dict[int, int] = {}
    for seq, prompt in enumerate(prompts):
        for pos, token in enumerate(prompt):
            batch.add(token, pos, [seq], pos == len(prompt) - 1)
            if pos == len(prompt) - 1:
                rows[seq] = batch.n_tokens - 1
    ctx.decode(batch)
    sampler = llama_cpp.LlamaSampler(llama_cpp.LlamaSamplerChainParams())
    sampler.add_greedy()
    generated = [0] * n_seq
    while rows:
        batch.clear()
        next_rows: dict[int, int] = {}
        for seq, row in rows.items():
            token = sampler.sample(ctx, row)
            if vocab.is_eog(token):
                continue
            generated[seq] += 1
            vocab.token_to_piece(token, 0, False)
            if generated[seq] < tokens:
                batch.add(token, len(prompts[seq]) + generated[seq] - 1, [seq], True)
                next_rows[seq] = batch.n_tokens - 1
        rows = next_rows
        if rows:
            ctx.decode(batch)
    elapsed = time.perf_counter() - start
    ctx.close()
    return elapsed, sum(generated)


def engine_batched(model: LlamaLoadedModel, n_seq: int, tokens: int) -> tuple[float, int]:
    """Seconds and tokens for `n_seq` concurrent greedy `generate` calls."""
    counts = [0] * n_seq

    def one(i: int) -> None:
        request = GenerationRequest(messages(i), max_output_tokens=tokens, temperature=0)
        for chunk in model.generate(request, None, lambda: False):
            counts[i] = chunk.usage.output_tokens

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n_seq)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start, sum(counts)


def child(args: argparse.Namespace) -> None:
    """One contention child: load, say ready, wait for go, decode for `--seconds`."""
    lock = None if args.lock == "none" else Path(args.lock)
    model = load_engine(args.threads, 1, lock)
    engine_batched(model, 1, 4)  # warm: the loop's context exists
    print("ready", flush=True)
    sys.stdin.readline()
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    tokens = 0
    while time.perf_counter() - start < args.seconds:
        tokens += engine_batched(model, 1, 32)[1]
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    print(json.dumps({"tokens": tokens, "seconds": elapsed, "cpu": cpu,
                      "nivcsw": after.ru_nivcsw - before.ru_nivcsw}), flush=True)


def contend(processes: int, *, threads: int, lock: str, seconds: float,
            env: dict[str, str]) -> list[dict[str, Any]]:
    """Start `processes` children, let them decode at the same time, collect figures."""
    command = [sys.executable, "-m", "bench.engine", "--child", "--threads", str(threads),
               "--lock", lock, "--seconds", str(seconds)]
    children = [subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True, cwd=ROOT, env={**os.environ, **env})
                for _ in range(processes)]
    for proc in children:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    for proc in children:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    results = []
    for proc in children:
        assert proc.stdout is not None
        results.append(json.loads(proc.stdout.readline()))
        proc.wait(60)
    return results


def describe(results: list[dict[str, Any]]) -> str:
    rates = [r["tokens"] / r["seconds"] for r in results]
    cpu = sum(r["cpu"] for r in results) / max(1, sum(r["tokens"] for r in results))
    switches = sum(r["nivcsw"] for r in results) / max(1, sum(r["tokens"] for r in results))
    each = " + ".join(f"{rate:.1f}" for rate in rates)
    return (f"{sum(rates):6.1f} tok/s in all ({each}); {cpu * 1000:.0f} ms CPU/token, "
            f"{switches:.1f} involuntary switches/token")


def load_average() -> str:
    return "load %.2f %.2f %.2f" % os.getloadavg()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=usable_cores())
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--sequences", default="1,2,4,8")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--skip", default="", help="comma list of: batched,contention")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--lock", default="none", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    skip = set(args.skip.split(","))
    print(f"threads {args.threads}, {args.tokens} tokens per sequence, greedy; {load_average()}")
    if "batched" not in skip:
        init_backend()  # before any model: it picks the CPU variant (AVX2, ...)
        bare_model = llama_cpp.LlamaModel(str(default_model_source()),
                                          llama_cpp.LlamaModelParams())
        model = load_engine(args.threads, 8, None)
        for n_seq in [int(n) for n in args.sequences.split(",")]:
            # Alternate, keep the best of two: the box is shared.
            bare = min(bare_batched(bare_model, args.threads, n_seq, args.tokens)
                       for _ in range(2))
            ours = min(engine_batched(model, n_seq, args.tokens) for _ in range(2))
            bare_rate, our_rate = bare[1] / bare[0], ours[1] / ours[0]
            print(f"N={n_seq}  ceiling {bare_rate:6.1f} tok/s   engine {our_rate:6.1f} tok/s"
                  f"   ratio {our_rate / bare_rate:.2f}   ({load_average()})")
    if "contention" not in skip:
        lock = str(Path(tempfile.mkdtemp()) / "engine.lock")
        t = args.threads
        spin = {"GOMP_SPINCOUNT": "300000"}  # libgomp's default: what the engine ran first
        passive = {"OMP_WAIT_POLICY": "passive"}  # what it ran next
        cases = [
            ("one process alone (default: short spin)", 1, t, "none", {}),
            ("one process alone, long spin (libgomp's default)", 1, t, "none", spin),
            ("one process alone, passive", 1, t, "none", passive),
            (f"two processes, {t} threads each, long spin, no lock", 2, t, "none", spin),
            ("two processes, 1 thread each, long spin, no lock", 2, 1, "none", spin),
            (f"two processes, {t} threads each, passive, no lock", 2, t, "none", passive),
            (f"two processes, {t} threads each, short spin, no lock (default)", 2, t, "none", {}),
            (f"two processes, {t} threads each, short spin, host lock (opt-in)", 2, t, lock, {}),
        ]
        for name, processes, threads, case_lock, env in cases:
            results = contend(processes, threads=threads, lock=case_lock,
                              seconds=args.seconds, env=env)
            print(f"{name:62s} {describe(results)}   ({load_average()})")


if __name__ == "__main__":
    main()
