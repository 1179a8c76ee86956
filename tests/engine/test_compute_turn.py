"""The engine's thread budget is the process's: the decode loops of two models take turns,
and the usable cores heed a cgroup CPU quota."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import core.engines.base as base
import core.engines.llama_loop as llama_loop
from core.engines.base import EngineOptions, GenerationRequest, ModelFile, cgroup_cpu_quota
from core.engines.llama import LlamaEngine
from core.engines.llama_native import llama_cpp
from core.model_files import sha256_of

REQUEST = GenerationRequest([{"role": "user", "content": "Tell a long story."}],
                            max_output_tokens=24, temperature=0)


class _OverlapSpy:
    """`llama_cpp` with contexts that count how many decodes run at once (a spy module:
    everything else is the real binding)."""

    def __init__(self) -> None:
        self.most_at_once = 0
        self._now = 0
        lock = threading.Lock()
        outer = self

        class Context(llama_cpp.LlamaContext):
            def decode(self, batch: llama_cpp.LlamaBatch) -> int:
                with lock:
                    outer._now += 1
                    outer.most_at_once = max(outer.most_at_once, outer._now)
                try:
                    return super().decode(batch)
                finally:
                    with lock:
                        outer._now -= 1

        self.LlamaContext = Context

    def __getattr__(self, name: str) -> object:
        return getattr(llama_cpp, name)


@pytest.mark.model
def test_two_models_in_use_decode_in_turns(
    default_model_file: ModelFile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = _OverlapSpy()
    monkeypatch.setattr(llama_loop, "llama_cpp", spy)
    other = tmp_path / "other.gguf"  # the same weights, another digest: another loop
    other.write_bytes(default_model_file.path.read_bytes() + b"\0" * 32)
    engine = LlamaEngine(EngineOptions(threads=2, cache_size=2))
    models = [engine.load(default_model_file),
              engine.load(ModelFile("other", other, sha256_of(other)))]
    made: list[int] = [0, 0]

    def generate(i: int) -> None:
        for chunk in models[i].generate(REQUEST, None, lambda: False):
            made[i] = chunk.usage.output_tokens

    threads = [threading.Thread(target=generate, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)

    assert made == [24, 24]
    assert spy.most_at_once == 1


def test_a_cgroup_quota_gives_its_whole_cores_the_tightest_level_winning(
        tmp_path: Path) -> None:
    (tmp_path / "unit" / "task").mkdir(parents=True)
    (tmp_path / "unit" / "cpu.max").write_text("250000 100000\n")
    (tmp_path / "unit" / "task" / "cpu.max").write_text("max 100000\n")

    assert cgroup_cpu_quota(tmp_path, "/unit/task") == 2


def test_a_quota_under_one_core_still_gives_one(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("50000 100000\n")

    assert cgroup_cpu_quota(tmp_path, "/") == 1


def test_no_quota_anywhere_is_none(tmp_path: Path) -> None:
    (tmp_path / "unit").mkdir()
    (tmp_path / "unit" / "cpu.max").write_text("max 100000\n")

    assert cgroup_cpu_quota(tmp_path, "/unit") is None


def test_the_usable_cores_heed_the_cgroup_quota(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The quota at the root counts wherever under it this process's cgroup is.
    (tmp_path / "cpu.max").write_text("100000 100000\n")
    monkeypatch.setattr(base, "CGROUP_ROOT", tmp_path)

    assert base.usable_cores() == 1
