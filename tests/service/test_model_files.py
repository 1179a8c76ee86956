"""A model file that changed or vanished after registration fails the task at once,
with a stable code, before any model runs (docs/http-api.md, model entry).

Each test registers its own copy of the default model (never the one in the
installed package, which must not be written to) with `taskward models add`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from core.model_files import default_model_source
from tests.scheduler.processes import run_json
from tests.service.conftest import Service
from tests.service.running import STORY, assert_log_sound, create, events, finished

pytestmark = pytest.mark.model

NEVER_RAN = ["response.created", "response.loading", "response.failed"]


def registered_copy(service: Service, model_id: str) -> Path:
    copy = service.models_dir / f"{model_id}.gguf"
    shutil.copyfile(default_model_source(), copy)
    assert copy.stat().st_ino != default_model_source().stat().st_ino  # a copy, not a link
    entry = run_json(service.running.env, "models", "add", str(copy), "--id", model_id)
    assert entry["id"] == model_id
    return copy


def overwrite_a_few_bytes(path: Path) -> None:
    """Flip four bytes in the middle of the file (size unchanged, content not)."""
    with path.open("r+b") as stream:
        stream.seek(path.stat().st_size // 2)
        original = stream.read(4)
        stream.seek(-4, 1)
        stream.write(bytes(b ^ 0xFF for b in original))


def assert_failed_without_running(client: httpx.Client, task_id: str, code: str) -> None:
    task = finished(client, task_id)
    assert (task["status"], task["error"]["code"]) == ("failed", code)
    assert (task["attempts"], task["dead_lettered"]) == (1, False)
    log = events(client, task_id)
    assert_log_sound(log, task["last_seq"])
    assert [e["type"] for e in log] == NEVER_RAN


def test_a_tampered_model_file_fails_with_model_digest_mismatch_and_is_not_retried(
    service: Service, client: httpx.Client
) -> None:
    copy = registered_copy(service, "tampered")
    # The copy runs while intact: its digest is now the one of a loaded, cached model.
    intact = create(client, **STORY, model="tampered", max_output_tokens=4)["id"]
    assert finished(client, intact)["status"] == "completed"

    overwrite_a_few_bytes(copy)
    task_id = create(client, **STORY, model="tampered", max_output_tokens=4,
                     max_attempts=3)["id"]

    assert_failed_without_running(client, task_id, "model_digest_mismatch")


def test_a_deleted_model_file_fails_with_model_file_missing_and_is_not_retried(
    service: Service, client: httpx.Client
) -> None:
    registered_copy(service, "deleted").unlink()

    task_id = create(client, **STORY, model="deleted", max_output_tokens=4, max_attempts=3)["id"]

    assert_failed_without_running(client, task_id, "model_file_missing")
