"""The local engine's model cache with models in use: one file's weights are loaded once,
however the cache turns over, and an unloaded model's loop does not linger."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections.abc import Iterator

import pytest

from core.engines.base import Chunk, EngineOptions, GenerationRequest, ModelFile
from core.engines.llama import LlamaEngine, LlamaLoadedModel
from core.model_files import sha256_of

LONG = GenerationRequest([{"role": "user", "content": "Tell a long story."}],
                         max_output_tokens=200, temperature=0)
SHORT = GenerationRequest([{"role": "user", "content": "Say hello."}],
                          max_output_tokens=2, temperature=0)


@pytest.fixture(scope="module")
def variants(default_model_file: ModelFile, tmp_path_factory: pytest.TempPathFactory
             ) -> list[ModelFile]:
    """Two more files of the default model's weights, each with a digest of its own."""
    folder = tmp_path_factory.mktemp("variants")
    weights = default_model_file.path.read_bytes()
    files = []
    for n in (1, 2):
        path = folder / f"variant{n}.gguf"
        path.write_bytes(weights + b"\0" * 32 * n)
        files.append(ModelFile(f"variant{n}", path, sha256_of(path)))
    return files


class _InUse:
    """A generation kept running on another thread until `end()`; holds the model only
    as an attempt's engine thread does, through the generation."""

    def __init__(self, model: LlamaLoadedModel) -> None:
        self._stop = threading.Event()
        self._started = threading.Event()
        chunks: Iterator[Chunk] = model.generate(LONG, None, self._stop.is_set)
        self._thread = threading.Thread(target=self._consume, args=(chunks,))
        self._thread.start()
        assert self._started.wait(60)

    def _consume(self, chunks: Iterator[Chunk]) -> None:
        for _chunk in chunks:
            self._started.set()

    def end(self) -> None:
        self._stop.set()
        self._thread.join(60)


@pytest.mark.model
def test_a_model_pushed_out_of_the_cache_while_in_use_is_not_loaded_again(
    default_model_file: ModelFile, variants: list[ModelFile]
) -> None:
    engine = LlamaEngine(EngineOptions(threads=1, cache_size=1))
    model = engine.load(default_model_file)
    held = weakref.ref(model)
    in_use = _InUse(model)
    del model

    engine.load(variants[0])  # the cache holds one: the model in use is pushed out
    try:
        again = engine.load(default_model_file)
        assert again is held()
        assert again is not None and again.loop.running
    finally:
        in_use.end()


@pytest.mark.model
def test_the_cache_pushes_out_an_idle_model_before_one_in_use(
    default_model_file: ModelFile, variants: list[ModelFile]
) -> None:
    engine = LlamaEngine(EngineOptions(threads=1, cache_size=2))
    model = engine.load(default_model_file)
    busy = weakref.ref(model)
    in_use = _InUse(model)
    del model
    idle = weakref.ref(engine.load(variants[0]))

    engine.load(variants[1])  # one of the two must go: the idle one
    in_use.end()
    gc.collect()

    assert idle() is None
    assert busy() is not None  # the cache holds it still, though its use has ended


@pytest.mark.model
def test_an_unloaded_models_loop_ends_at_once_rather_than_idling(
    default_model_file: ModelFile, variants: list[ModelFile]
) -> None:
    engine = LlamaEngine(EngineOptions(threads=1, cache_size=1))
    model = engine.load(default_model_file)
    list(model.generate(SHORT, None, lambda: False))
    loop = model.loop
    assert loop.running  # idle, for a few seconds yet
    del model

    engine.load(variants[0])  # out of the cache, and nothing else holds it
    started = time.monotonic()
    while loop.running and time.monotonic() - started < 10:
        time.sleep(0.02)

    assert not loop.running
    assert time.monotonic() - started < 1  # the idle wait is 5 s

