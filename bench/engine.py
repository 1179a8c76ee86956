"""Bare-engine figures for the default model: load time, RSS, greedy tokens/s, resume cost.

Run from the repository root: `.venv/bin/python -m bench.engine [--threads N]`.
The peer is the same llama.cpp token loop written directly against `cyllama` (one
greedy sampler, no snapshots, no UTF-8 assembly), so the difference is what the
engine's per-token bookkeeping costs.
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

from cyllama.llama import llama_cpp

from core.engines.base import EngineOptions, GenerationRequest, ModelFile
from core.engines.llama import LlamaEngine, LlamaLoadedModel
from core.model_files import DEFAULT_MODEL_ID, default_model_source, sha256_of

MESSAGES = [
    {"role": "system", "content": "You are a storyteller."},
    {"role": "user", "content": "Tell a long story about a lighthouse keeper."},
]


def rss_mib() -> tuple[float, float]:
    """Current and peak resident set size in MiB (Linux)."""
    status = Path("/proc/self/status").read_text()
    current_kib = next(
        int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS")
    )
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return current_kib / 1024, peak_kib / 1024


def engine_run(model: LlamaLoadedModel, request: GenerationRequest) -> tuple[float, float, int]:
    """Seconds to the first chunk, seconds in total, generated tokens."""
    start = time.perf_counter()
    first = None
    last = None
    for chunk in model.generate(request, None, lambda: False):
        first = first or time.perf_counter()
        last = chunk
    assert first is not None and last is not None
    return first - start, time.perf_counter() - start, last.usage.output_tokens


def peer_run(llama_model: llama_cpp.LlamaModel, threads: int, n_tokens: int) -> tuple[float, int]:
    """Seconds and tokens for the same greedy generation as a bare cyllama loop."""
    vocab = llama_model.get_vocab()
    chat = [llama_cpp.LlamaChatMessage(role=m["role"], content=m["content"]) for m in MESSAGES]
    prompt = vocab.tokenize(llama_model.chat_apply_template(None, chat, True), True, True)
    params = llama_cpp.LlamaContextParams()
    params.n_ctx = len(prompt) + n_tokens
    params.n_batch = params.n_ubatch = 512
    params.n_threads = params.n_threads_batch = threads
    start = time.perf_counter()
    ctx = llama_cpp.LlamaContext(llama_model, params)
    sampler = llama_cpp.LlamaSampler(llama_cpp.LlamaSamplerChainParams())
    sampler.add_greedy()
    ctx.decode(llama_cpp.llama_batch_get_one(prompt, 0))
    generated = 0
    while generated < n_tokens:
        token = sampler.sample(ctx, -1)
        if vocab.is_eog(token):
            break
        vocab.token_to_piece(token, 0, False)
        ctx.decode(llama_cpp.llama_batch_get_one([token], len(prompt) + generated))
        generated += 1
    elapsed = time.perf_counter() - start
    ctx.close()
    return elapsed, generated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=EngineOptions().threads)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    source = default_model_source()
    started = time.perf_counter()
    digest = sha256_of(source)
    hashed = time.perf_counter()
    model = LlamaEngine(EngineOptions(threads=args.threads)).load(
        ModelFile(DEFAULT_MODEL_ID, source, digest)
    )
    loaded = time.perf_counter()
    rss, _ = rss_mib()
    size_mib = source.stat().st_size / 2**20
    print(f"model       {source.name} ({size_mib:.0f} MiB), {args.threads} threads")
    print(f"sha256      {hashed - started:.3f} s (first time in this process; then cached)")
    print(f"load        {loaded - hashed:.3f} s")
    print(f"rss         {rss:.0f} MiB after load (weights are mmapped)")

    # Engine and peer runs alternate and the best of each is kept: this box is shared.
    request = GenerationRequest(MESSAGES, max_output_tokens=args.tokens)
    peer_params = llama_cpp.LlamaModelParams()
    peer_params.n_gpu_layers = 0
    peer_model = llama_cpp.LlamaModel(str(source), peer_params)
    engine_runs, peer_runs = [], []
    for _ in range(args.runs):
        engine_runs.append(engine_run(model, request))
        peer_runs.append(peer_run(peer_model, args.threads, args.tokens))
    first_chunk, total, tokens = min(engine_runs, key=lambda r: r[1])
    peer_total, peer_tokens = min(peer_runs)
    print(
        f"engine      {tokens} tokens in {total:.3f} s: {tokens / total:.1f} tokens/s "
        f"(first chunk after {first_chunk * 1000:.0f} ms; best of {args.runs})"
    )
    print(
        f"peer        {peer_tokens} tokens in {peer_total:.3f} s: "
        f"{peer_tokens / peer_total:.1f} tokens/s (bare cyllama loop, best of {args.runs})"
    )

    snapshot = list(model.generate(request, None, lambda: False))[-2].snapshot
    resumes = []
    for _ in range(args.runs):
        resume_start = time.perf_counter()
        next(iter(model.generate(request, snapshot, lambda: False)))
        resumes.append(time.perf_counter() - resume_start)
    print(
        f"resume      first new chunk after {min(resumes):.3f} s "
        f"(replays prompt + {len(snapshot['tokens'])} tokens one by one; best of {args.runs})"
    )
    _, peak = rss_mib()
    print(f"rss peak    {peak:.0f} MiB")


if __name__ == "__main__":
    main()
