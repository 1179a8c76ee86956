"""The model registry over HTTP: scopes, digests computed by the service, the path fence,
and the same refusal codes as `taskward models add` / `add-upstream`."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from litestar.testing import TestClient

from core.settings import Settings
from core.store.database import Database
from infra.cli import main
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


def test_the_openai_engine_without_an_upstream_is_upstream_required(
    db: Database, http: TestClient[Any]
) -> None:
    answer = model_admin(db, http).post("/v1/models", json={"id": "m", "engine": "openai"})
    assert (answer.status_code, answer.json()["code"]) == (422, "upstream_required")
    assert answer.json()["field"] == "engine"


def test_neither_a_path_nor_an_upstream_is_a_validation_error_naming_path(
    db: Database, http: TestClient[Any]
) -> None:
    answer = model_admin(db, http).post("/v1/models", json={"id": "m"})
    assert (answer.status_code, answer.json()["code"]) == (422, "validation_error")
    assert answer.json()["field"] == "path"


SERVERS = ["http://10.0.0.5:8000/v1"]
LONG_URL = "http://10.0.0.5:8000/" + "p" * 2030 + "/v1"


@pytest.mark.parametrize(("body", "command", "code"), [
    ({"id": "m", "upstream": {"base_urls": SERVERS, "model": ""}},
     ["add-upstream", "m", "--base-url", SERVERS[0], "--upstream-model", ""],
     "invalid_upstream_model"),
    ({"id": "m", "upstream": {"base_urls": SERVERS, "model": "n" * 201}},
     ["add-upstream", "m", "--base-url", SERVERS[0], "--upstream-model", "n" * 201],
     "invalid_upstream_model"),
    ({"id": "m", "upstream": {"base_urls": SERVERS, "model": "n", "api_key_env": "K" * 129}},
     ["add-upstream", "m", "--base-url", SERVERS[0], "--upstream-model", "n",
      "--api-key-env", "K" * 129],
     "invalid_api_key_env"),
    ({"id": "m", "upstream": {"base_urls": [LONG_URL], "model": "n"}},
     ["add-upstream", "m", "--base-url", LONG_URL, "--upstream-model", "n"],
     "invalid_upstream_url"),
    ({"id": "", "upstream": {"base_urls": SERVERS, "model": "n"}},
     ["add-upstream", "", "--base-url", SERVERS[0], "--upstream-model", "n"],
     "invalid_model_id"),
    ({"path": "tiny.gguf", "id": "", "engine": "test.words"},
     ["add", "tiny.gguf", "--id", "", "--engine", "test.words"], "invalid_model_id"),
    ({"path": "tiny.gguf", "id": "i" * 201, "engine": "test.words"},
     ["add", "tiny.gguf", "--id", "i" * 201, "--engine", "test.words"], "invalid_model_id"),
    ({"path": "tiny.gguf", "engine": "no such engine!"},
     ["add", "tiny.gguf", "--engine", "no such engine!"], "unknown_engine"),
    ({"path": "tiny.gguf", "engine": ""}, ["add", "tiny.gguf", "--engine", ""],
     "unknown_engine"),
    ({"path": "tiny.gguf", "engine": "openai"}, ["add", "tiny.gguf", "--engine", "openai"],
     "upstream_required"),
])
def test_the_api_and_the_cli_refuse_a_registration_with_the_same_code(
    db: Database, http: TestClient[Any], settings: Settings, monkeypatch: pytest.MonkeyPatch,
    body: dict[str, Any], command: list[str], code: str,
) -> None:
    (settings.models_dir / "tiny.gguf").write_bytes(b"weights")
    monkeypatch.setenv("TASKWARD_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("TASKWARD_MODELS_DIR", str(settings.models_dir))
    monkeypatch.chdir(settings.models_dir)
    admin = model_admin(db, http)
    answer = admin.post("/v1/models", json=body)
    assert (answer.status_code, answer.json()["code"]) == (422, code), answer.text
    refused = CliRunner().invoke(main, ["models", *command])
    assert refused.exit_code == 1 and f"Error: {code}: " in refused.output, refused.output
    assert admin.get("/v1/models").json()["data"] == []
