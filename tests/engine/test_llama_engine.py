"""The llama.cpp engine against the real default model: determinism, stopping, resume."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable
from pathlib import Path

import pytest

from core.engines.base import Chunk, EngineError, EngineOptions, GenerationRequest, ModelFile
from core.engines.llama import LlamaEngine, LlamaLoadedModel
from core.engines.llama_native import llama_cpp
from core.engines.llama_text import Utf8Pieces
from core.engines.registry import engine_named
from core.model_files import sha256_of

REPO = Path(__file__).resolve().parents[2]
MESSAGES = [
    {"role": "system", "content": "You are a storyteller."},
    {"role": "user", "content": "Tell a long story about a lighthouse keeper."},
]
GREEDY = GenerationRequest(MESSAGES, max_output_tokens=24)
SEEDED = GenerationRequest(MESSAGES, max_output_tokens=24, temperature=0.8, top_p=0.95, seed=1234)


def run(
    model: LlamaLoadedModel,
    request: GenerationRequest,
    snapshot: dict | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> list[Chunk]:
    return list(model.generate(request, snapshot, should_stop))


def text(chunks: list[Chunk]) -> str:
    return "".join(chunk.text for chunk in chunks)


def interrupted_after(model: LlamaLoadedModel, request: GenerationRequest, k: int) -> list[Chunk]:
    """The chunks a run yields when `should_stop` turns true once k chunks arrived."""
    received: list[Chunk] = []
    for chunk in model.generate(request, None, lambda: len(received) >= k):
        received.append(chunk)
    return received


def continue_in_new_process(
    request: GenerationRequest, snapshot: dict, beside: list[dict] | None = None
) -> str:
    """The text a fresh process generates resuming `snapshot`, with the `beside`
    requests already running in its decode loop."""
    job = {"request": dataclasses.asdict(request), "snapshot": snapshot,
           "beside": beside or []}
    child = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("resume_child.py"))],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    return "".join(json.loads(child.stdout))


@pytest.mark.model
def test_greedy_generation_is_deterministic(default_model: LlamaLoadedModel) -> None:
    first, second = run(default_model, GREEDY), run(default_model, GREEDY)

    assert text(first)
    assert text(first) == text(second)


@pytest.mark.model
def test_seeded_sampling_is_deterministic_for_the_same_seed(
    default_model: LlamaLoadedModel,
) -> None:
    first, second = run(default_model, SEEDED), run(default_model, SEEDED)

    assert text(first)
    assert text(first) == text(second)


@pytest.mark.model
def test_should_stop_ends_generation_within_one_token(default_model: LlamaLoadedModel) -> None:
    full = run(default_model, GREEDY)

    received = interrupted_after(default_model, GREEDY, 5)

    assert len(full) > 6
    assert 5 <= len(received) <= 6
    assert text(full).startswith(text(received))


@pytest.mark.model
@pytest.mark.parametrize("request_", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_resume_in_a_new_process_equals_an_uninterrupted_run(
    default_model: LlamaLoadedModel, request_: GenerationRequest
) -> None:
    uninterrupted = text(run(default_model, request_))
    before = interrupted_after(default_model, request_, 7)

    after = continue_in_new_process(request_, before[-1].snapshot)

    assert text(before) + after == uninterrupted


@pytest.mark.model
@pytest.mark.parametrize("k", [1, 12])
def test_unseeded_sampling_resumes_with_the_seed_kept_in_the_snapshot(
    default_model: LlamaLoadedModel, k: int
) -> None:
    request = dataclasses.replace(SEEDED, seed=None)
    chunks = run(default_model, request)

    rest = run(default_model, request, chunks[k - 1].snapshot)

    assert text(chunks[:k]) + text(rest) == text(chunks)


@pytest.mark.model
def test_usage_counts_prompt_tokens_and_cumulative_generated_tokens(
    default_model: LlamaLoadedModel,
) -> None:
    chunks = run(default_model, GREEDY)
    resumed = run(default_model, GREEDY, chunks[3].snapshot)

    last = chunks[-1]
    assert last.usage.input_tokens > 0
    # A long story does not end within 24 tokens, so the limit is what stops it.
    assert last.usage.output_tokens == GREEDY.max_output_tokens == len(last.snapshot["tokens"])
    assert [c.usage.output_tokens for c in chunks] == sorted(c.usage.output_tokens for c in chunks)
    assert resumed[-1].usage == last.usage


@pytest.mark.model
@pytest.mark.parametrize("temperature", [1e-45, 1e-38, 1e-7])
def test_a_temperature_next_to_zero_is_greedy(
    default_model: LlamaLoadedModel, temperature: float
) -> None:
    near_zero = dataclasses.replace(GREEDY, temperature=temperature, seed=7)

    assert text(run(default_model, near_zero)) == text(run(default_model, GREEDY))


@pytest.mark.model
@pytest.mark.parametrize("role", ["system", "user"])
def test_text_after_a_nul_in_a_message_is_part_of_the_prompt(
    default_model: LlamaLoadedModel, role: str
) -> None:
    def count(content: str) -> int:
        return len(default_model.prompt_tokens([{"role": role, "content": content}]))

    tail = " world" * 200
    nul_tokens = count("hello\0") - count("hello")

    assert nul_tokens > 0
    assert count("hello\0" + tail) == count("hello" + tail) + nul_tokens


@pytest.mark.model
def test_a_foreign_snapshot_is_refused(default_model: LlamaLoadedModel) -> None:
    with pytest.raises(EngineError) as caught:
        run(default_model, GREEDY, {"v": 99, "tokens": [1, 2], "seed": None})

    assert caught.value.code == "invalid_snapshot"
    assert not caught.value.retryable


@pytest.mark.model
def test_a_prompt_longer_than_the_context_is_context_length_exceeded(
    default_model: LlamaLoadedModel,
) -> None:
    request = GenerationRequest([{"role": "user", "content": "lighthouse " * 9000}])

    with pytest.raises(EngineError) as caught:
        run(default_model, request)

    assert caught.value.code == "context_length_exceeded"
    assert not caught.value.retryable
    assert "lighthouse" not in caught.value.message


@pytest.mark.model
def test_concurrent_generations_share_one_loaded_model(default_model: LlamaLoadedModel) -> None:
    expected = text(run(default_model, GREEDY))
    results: list[str] = []
    threads = [
        threading.Thread(target=lambda: results.append(text(run(default_model, GREEDY))))
        for _ in range(2)
    ]

    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert results == [expected, expected]


@pytest.mark.model
def test_load_reuses_the_model_cached_for_a_digest(
    llama_engine: LlamaEngine, default_model_file: ModelFile
) -> None:
    assert llama_engine.load(default_model_file) is llama_engine.load(default_model_file)


@pytest.mark.model
def test_the_cache_evicts_the_least_recently_used_model(
    tmp_path: Path, default_model_file: ModelFile
) -> None:
    other = tmp_path / "other.gguf"  # the same weights, another digest
    other.write_bytes(default_model_file.path.read_bytes() + b"\0" * 32)
    engine = LlamaEngine(EngineOptions(threads=1, cache_size=1))
    first = weakref.ref(engine.load(default_model_file))  # loaded, then held by no task

    engine.load(ModelFile("other", other, sha256_of(other)))

    assert first() is None  # unloaded: the cache held it alone


def test_the_engine_is_registered_as_llama_cpp() -> None:
    assert isinstance(engine_named("llama.cpp", EngineOptions), LlamaEngine)


@pytest.mark.parametrize("content", ["garbage", "truncated"])
def test_a_corrupt_model_file_is_model_load_failed(
    tmp_path: Path, default_model_file: ModelFile, content: str
) -> None:
    corrupt = tmp_path / "corrupt.gguf"
    if content == "garbage":
        corrupt.write_bytes(os.urandom(64 * 1024))
    else:
        corrupt.write_bytes(default_model_file.path.read_bytes()[: 1024 * 1024])

    with pytest.raises(EngineError) as caught:
        LlamaEngine(EngineOptions()).load(ModelFile("corrupt", corrupt, sha256_of(corrupt)))

    assert caught.value.code == "model_load_failed"
    assert not caught.value.retryable


@pytest.mark.model
def test_text_pieces_never_split_a_multibyte_character(default_model_file: ModelFile) -> None:
    # A full load: this llama.cpp build aborts on vocab_only models.
    vocab_model = llama_cpp.LlamaModel(str(default_model_file.path), llama_cpp.LlamaModelParams())
    vocab = vocab_model.get_vocab()  # borrowed: valid while vocab_model lives
    sample = "héllo → 日本語 😀 ok"
    pieces = Utf8Pieces(vocab)

    emitted = [pieces.push(token) for token in vocab.tokenize(sample, False, False)]

    assert "" in emitted  # some characters did span tokens
    assert all("\ufffd" not in piece for piece in emitted)
    assert "".join(emitted) + pieces.flush() == sample


@pytest.mark.model
def test_a_character_cut_off_by_the_end_is_left_out_not_replaced(
        default_model_file: ModelFile) -> None:
    vocab_model = llama_cpp.LlamaModel(str(default_model_file.path), llama_cpp.LlamaModelParams())
    vocab = vocab_model.get_vocab()
    tokens = vocab.tokenize("ok 😀", False, False)
    pieces = Utf8Pieces(vocab)
    emitted = "".join(pieces.push(token) for token in tokens[:-1])  # the emoji's last byte
    assert emitted + pieces.flush() == "ok "
