"""What the model check costs at a task's start: the digest cache keyed on the file's
identity and change time, beside the size-and-mtime cache it replaced, in one run.

Run from the repository root: `.venv/bin/python -m bench.digest [--seconds 3]`.
A model file (`--megabytes`, default 64) is registered in a fresh SQLite store; then,
alternating rounds of `--seconds` each:
- `verified_model_file`: the registry row (a worker gets it with its claim), then the
  path fence and digest check of `verified_entry` that a worker runs before every
  batch (a cache hit, since the file does not change);
- the same check with the old cache (`Path.resolve` + `stat`, keyed on real path, size
  and mtime_ns: the one a same-size rewrite with a restored mtime could fool), kept
  here only as the peer;
and, once each, the cold hash of the file (what a cache miss costs, the same for both).
The machine is shared and noisy: compare figures within one run, not across runs.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import select

import tests.engines  # noqa: F401  registers the `test.words` engine the entry names
from core import model_files
from core.model_files import resolve_inside
from core.models_registry import register, verified_model_file
from core.settings import Settings
from core.store.connect import open_database
from core.store.database import Database
from core.tables import models
from infra.migrate import upgrade


@functools.lru_cache(maxsize=64)
def _old_cached(real: Path, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with real.open("rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def old_check(db: Database, models_dir: Path, model_id: str) -> None:
    """The check before this change: resolve, stat, a cache keyed on (path, size, mtime)."""
    with db.read() as conn:
        row = conn.execute(select(models).where(models.c.id == model_id)).one()
    real = resolve_inside(models_dir, row.path)
    stat = real.resolve().stat()
    if real.stat().st_size != row.size_bytes or _old_cached(
            real.resolve(), stat.st_size, stat.st_mtime_ns) != row.sha256:
        raise SystemExit("digest mismatch")


def per_second(seconds: float, work: Callable[[], object]) -> float:
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        work()
        count += 1
    return count / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--megabytes", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        models_dir = Path(tmp, "models")
        models_dir.mkdir()
        Path(models_dir, "model.bin").write_bytes(os.urandom(args.megabytes << 20))
        db = open_database(Settings(database_url=f"sqlite:///{tmp}/bench.db",
                                    models_dir=models_dir))
        upgrade(db.engine)
        register(db, models_dir, "model.bin", model_id="m", engine="test.words")
        new = functools.partial(verified_model_file, db, models_dir, "m")
        old = functools.partial(old_check, db, models_dir, "m")
        old()  # warm the old cache, as the new one is warm from registration
        figures: dict[str, list[float]] = {"new": [], "old": []}
        for _ in range(args.rounds):
            figures["new"].append(per_second(args.seconds, new))
            figures["old"].append(per_second(args.seconds, old))
        fd = os.open(Path(models_dir, "model.bin"), os.O_RDONLY)
        start = time.perf_counter()
        model_files._hash_descriptor(fd, os.fstat(fd).st_size)
        cold = time.perf_counter() - start
        os.close(fd)
        db.dispose()
    for name, label in (("new", "(dev, ino, ctime, size, mtime)"), ("old", "(path, size, mtime)")):
        best = max(figures[name])
        print(f"check keyed on {label:32} {best:8.0f} checks/s  {1e6 / best:6.1f} us each  "
              f"(rounds: {', '.join(f'{f:.0f}' for f in figures[name])})")
    print(f"cold hash of {args.megabytes} MiB (a cache miss, either way): {cold * 1000:.0f} ms")


if __name__ == "__main__":
    main()
