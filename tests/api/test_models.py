"""The model registry over HTTP: scopes, digests computed by the service, the path fence."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from litestar.testing import TestClient

from core.settings import Settings
from core.store.database import Database
from tests.api.helpers import Caller, caller


def model_admin(db: Database, http: TestClient[Any]) -> Caller:
    return caller(db, http, "models:admin", "models:read")


def test_registering_computes_the_digest(
    db: Database, http: TestClient[Any], settings: Settings
) -> None:
    (settings.models_dir / "tiny.gguf").write_bytes(b"weights" * 1000)
    answer = model_admin(db, http).post("/v1/models", json={"path": "tiny.gguf",
                                                            "engine": "test.words"})
    assert answer.status_code == 201
    entry = answer.json()
    assert entry["id"] == "tiny" and entry["object"] == "model"
    assert entry["sha256"] == hashlib.sha256(b"weights" * 1000).hexdigest()
    assert entry["size_bytes"] == 7000


def test_models_are_listed_and_shown_with_models_read(alice: Caller, model_id: str) -> None:
    listed = alice.get("/v1/models").json()
    assert [m["id"] for m in listed["data"]] == [model_id]
    assert alice.get(f"/v1/models/{model_id}").json()["id"] == model_id


def test_an_unknown_model_is_404(alice: Caller) -> None:
    assert alice.get("/v1/models/nothing-here").status_code == 404


def test_registering_needs_models_admin(alice: Caller) -> None:
    assert alice.post("/v1/models", json={"path": "x.gguf"}).status_code == 403


def test_paths_outside_the_models_directory_are_refused(
    db: Database, http: TestClient[Any], settings: Settings, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.gguf"
    outside.write_bytes(b"secret")
    os.symlink(outside, settings.models_dir / "link.gguf")
    admin = model_admin(db, http)
    for path in ("../outside.gguf", str(outside), "link.gguf"):
        answer = admin.post("/v1/models", json={"path": path})
        assert answer.status_code == 422, path
        assert answer.json()["code"] == "model_path_outside_models_dir"


def test_a_missing_file_is_refused(db: Database, http: TestClient[Any]) -> None:
    answer = model_admin(db, http).post("/v1/models", json={"path": "absent.gguf"})
    assert (answer.status_code, answer.json()["code"]) == (422, "model_file_missing")


def test_removing_keeps_the_file(
    db: Database, http: TestClient[Any], settings: Settings, model_id: str
) -> None:
    admin = model_admin(db, http)
    assert admin.delete(f"/v1/models/{model_id}").status_code == 204
    assert admin.get(f"/v1/models/{model_id}").status_code == 404
    assert (settings.models_dir / "words.bin").is_file()
