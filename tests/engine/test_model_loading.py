"""Loading a model file: the weights loaded are the bytes verified, and they are the
process's own, so nothing done to the file afterwards reaches a loaded model."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from core.engines.base import EngineError, EngineOptions, ModelFile
from core.engines.llama import LlamaEngine, LlamaLoadedModel
from core.engines.llama_native import llama_cpp
from core.model_files import default_model_source
from core.models_registry import verified_entry
from core.store.models import ModelEntry

REPO = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("damage_child.py")
PAD = 32  # trailing bytes llama.cpp never reads: two files that load alike, digests apart
# Installs a spy on llama.cpp's loader that runs its argument first; gives what it read.
SpyOnLoads = Callable[[Callable[[], None]], list[str]]


@pytest.fixture(scope="module")
def good_bytes() -> bytes:
    return default_model_source().read_bytes() + b"\0" * PAD


@pytest.fixture
def models_dir(tmp_path: Path, good_bytes: bytes) -> Path:
    directory = tmp_path / "models"
    directory.mkdir()
    (directory / "m.gguf").write_bytes(good_bytes)
    (tmp_path / "tampered.gguf").write_bytes(good_bytes[:-PAD] + b"\1" * PAD)
    return directory


@pytest.fixture
def checked(models_dir: Path, good_bytes: bytes) -> ModelFile:
    """The model file as the worker's check before a task hands it to the engine."""
    entry = ModelEntry(id="m", engine="llama.cpp", path="m.gguf", size_bytes=len(good_bytes),
                       sha256=hashlib.sha256(good_bytes).hexdigest(), metadata_json="{}",
                       upstream_json=None, max_concurrency=None)
    model_file = verified_entry(models_dir, entry)[1]
    assert isinstance(model_file, ModelFile)
    return model_file


@pytest.fixture
def read_digests(monkeypatch: pytest.MonkeyPatch) -> SpyOnLoads:
    """Wraps llama.cpp's loader: `before` runs as the load starts (a swap injected right
    there), and the returned list gets the SHA-256 of every file llama.cpp is given."""
    real = llama_cpp.LlamaModel

    def install(before: Callable[[], None]) -> list[str]:
        digests: list[str] = []

        def loading(path: str, params: llama_cpp.LlamaModelParams) -> llama_cpp.LlamaModel:
            before()
            digests.append(hashlib.sha256(Path(path).read_bytes()).hexdigest())
            return real(path, params)

        monkeypatch.setattr(llama_cpp, "LlamaModel", loading)
        return digests

    return install


def _swap(models_dir: Path) -> None:
    os.replace(models_dir.parent / "tampered.gguf", models_dir / "m.gguf")


@pytest.mark.model
@pytest.mark.parametrize("damage", ["truncate", "overwrite"])
def test_a_loaded_model_generates_on_after_its_file_is_damaged_in_place(
    tmp_path: Path, default_model: LlamaLoadedModel, damage: str
) -> None:
    from tests.engine.damage_child import REQUEST

    child = subprocess.run([sys.executable, str(CHILD), str(tmp_path), damage],
                           capture_output=True, text=True, cwd=REPO, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(REPO)})

    assert child.returncode == 0, child.stderr[-2000:]  # not -7, SIGBUS
    expected = "".join(c.text for c in default_model.generate(REQUEST, None, lambda: False))
    assert json.loads(child.stdout) == expected


@pytest.mark.model
def test_a_file_swapped_after_its_check_fails_the_load_and_is_not_cached(
    models_dir: Path, checked: ModelFile, good_bytes: bytes, read_digests: SpyOnLoads
) -> None:
    engine = LlamaEngine(EngineOptions(threads=1))
    loaded = read_digests(lambda: None)
    _swap(models_dir)

    with pytest.raises(EngineError) as failed:
        engine.load(checked)

    assert (failed.value.code, failed.value.retryable) == ("model_digest_mismatch", False)
    (models_dir / "m.gguf").write_bytes(good_bytes)
    engine.load(checked)  # the good file back: loaded now, nothing stale was cached
    assert loaded == [checked.sha256]


@pytest.mark.model
def test_a_file_swapped_as_the_load_starts_is_never_read(
    models_dir: Path, checked: ModelFile, read_digests: SpyOnLoads
) -> None:
    loaded = read_digests(lambda: _swap(models_dir))

    with pytest.raises(EngineError) as failed:  # its entry's file is gone: as a mismatch
        LlamaEngine(EngineOptions(threads=1)).load(checked)

    assert loaded == [checked.sha256]  # llama.cpp read the checked bytes, not the swapped
    assert (failed.value.code, failed.value.retryable) == ("model_file_changed", False)


@pytest.mark.model
def test_a_file_written_in_place_while_it_loads_fails_the_load(
    models_dir: Path, checked: ModelFile, read_digests: SpyOnLoads
) -> None:
    def write_in_place() -> None:
        with (models_dir / "m.gguf").open("r+b") as file:
            file.seek(-1, os.SEEK_END)
            file.write(b"\1")

    read_digests(write_in_place)

    with pytest.raises(EngineError) as failed:
        LlamaEngine(EngineOptions(threads=1)).load(checked)

    assert (failed.value.code, failed.value.retryable) == ("model_file_changed", False)
