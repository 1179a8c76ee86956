"""A model file that vanishes, loops, changes type or is tampered with fails its task at
once and non-retryably (no lease wait, no `max_attempts_exceeded`), on both stores."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from core.models_registry import register
from core.settings import Settings
from core.states import Status
from core.store.database import Database
from core.store.models import remove
from tests.scheduler.helpers import run_pass
from tests.store.helpers import new_task, task_row

MODEL_FILE = "words.bin"  # the `model_id` fixture's file


def vanish(path: Path) -> None:
    path.unlink()


def loop(path: Path) -> None:
    path.unlink()
    path.symlink_to(path.with_name("loop-b"))
    path.with_name("loop-b").symlink_to(path)


def directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


def fifo(path: Path) -> None:  # opening it for reading would block for ever
    path.unlink()
    os.mkfifo(path)


@pytest.mark.parametrize(("swap", "code"), [
    (vanish, "model_file_missing"), (loop, "model_file_unreadable"),
    (directory, "model_file_missing"), (fifo, "model_file_missing"),
])
def test_a_model_file_swapped_after_registration_fails_the_task_at_once(
    db: Database, fast: Settings, model_id: str, swap: Callable[[Path], None], code: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    task_id = new_task(db, model_id)
    swap(fast.models_dir / MODEL_FILE)
    run_pass(db, fast)
    row = task_row(db, task_id)
    assert (row.status, row.error_code, row.attempts) == (Status.FAILED, code, 1)
    assert "Traceback" not in caplog.text and "abandoned" not in caplog.text


def test_same_size_same_mtime_tampering_is_caught_after_a_cached_check(
    db: Database, fast: Settings, model_id: str
) -> None:
    path = fast.models_dir / MODEL_FILE
    first = new_task(db, model_id)
    run_pass(db, fast)  # the digest is now cached for this file
    assert task_row(db, first).status == Status.COMPLETED
    before = path.stat()
    original = path.read_bytes()
    path.write_bytes(bytes(b ^ 1 for b in original))  # other bytes, the same size
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    second = new_task(db, model_id)
    run_pass(db, fast)
    row = task_row(db, second)
    assert (row.status, row.error_code) == (Status.FAILED, "model_digest_mismatch")


def test_a_model_registered_again_for_other_content_is_checked_against_its_new_entry(
    db: Database, fast: Settings, model_id: str
) -> None:
    """The entry a task is checked against is the one its claim read: nothing of the
    entry is kept from one batch to the next."""
    first = new_task(db, model_id)
    run_pass(db, fast)
    assert task_row(db, first).status == Status.COMPLETED
    remove(db, model_id)
    (fast.models_dir / "other.bin").write_bytes(b"another test engine model\n")
    register(db, fast.models_dir, "other.bin", model_id=model_id, engine="test.words")
    (fast.models_dir / MODEL_FILE).unlink()  # the old entry's file: checking it would fail
    second = new_task(db, model_id)
    run_pass(db, fast)
    assert task_row(db, second).status == Status.COMPLETED
    (fast.models_dir / "other.bin").write_bytes(b"changed after the second batch\n")
    third = new_task(db, model_id)
    run_pass(db, fast)
    row = task_row(db, third)
    assert (row.status, row.error_code) == (Status.FAILED, "model_digest_mismatch")
