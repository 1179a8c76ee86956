"""Upstream model entries over HTTP and the CLI, on both stores: shown with the key's
variable name (never a key), refused with stable codes before anything is stored."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from click.testing import CliRunner
from litestar.testing import TestClient

from core.settings import Settings
from core.store.database import Database
from infra.app import serving_app
from infra.cli import main
from tests.api.conftest import http  # noqa: F401  (fixture shared with tests/api)
from tests.api.helpers import Caller, caller

UPSTREAM = {"base_urls": ["http://10.0.0.5:8000/v1/", "https://gpu-2.internal/v1"],
            "model": "meta-llama/Llama-3.1-8B-Instruct", "api_key_env": "VLLM_KEY",
            "max_concurrency": 8}


def admin(db: Database, http: TestClient[Any]) -> Caller:  # noqa: F811
    return caller(db, http, "models:admin", "models:read")


def test_an_upstream_entry_is_registered_and_shown_without_path_or_key(
    db: Database, http: TestClient[Any], monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    monkeypatch.setenv("VLLM_KEY", "sk-secret-never-shown")
    me = admin(db, http)
    answer = me.post("/v1/models", json={"id": "llama-8b", "engine": "openai",
                                         "upstream": UPSTREAM})
    assert answer.status_code == 201, answer.text
    entry = answer.json()
    assert (entry["engine"], entry["path"], entry["size_bytes"], entry["sha256"]) == (
        "openai", None, None, None)
    assert entry["upstream"] == {
        "base_urls": ["http://10.0.0.5:8000/v1", "https://gpu-2.internal/v1"],
        "model": "meta-llama/Llama-3.1-8B-Instruct", "api_key_env": "VLLM_KEY",
        "max_concurrency": 8, "timeout_seconds": 60.0}
    listed = me.get("/v1/models")
    assert [m["id"] for m in listed.json()["data"]] == ["llama-8b"]
    assert "sk-secret" not in listed.text and "sk-secret" not in answer.text


@pytest.mark.parametrize(("change", "code"), [
    ({"base_urls": ["ftp://host/v1"]}, "invalid_upstream_url"),
    ({"base_urls": ["http://host:8000"]}, "invalid_upstream_url"),
    ({"base_urls": ["http://user:pw@host/v1"]}, "invalid_upstream_url"),
    ({"base_urls": ["http://host:99999/v1"]}, "invalid_upstream_url"),
    ({"max_concurrency": 0}, "invalid_max_concurrency"),
    ({"max_concurrency": 4097}, "invalid_max_concurrency"),
    ({"api_key_env": "NOT A NAME"}, "invalid_api_key_env"),
    ({"base_urls": []}, "validation_error"),
])
def test_bad_upstream_objects_are_refused_with_stable_codes(
    db: Database, http: TestClient[Any], change: dict[str, Any], code: str  # noqa: F811
) -> None:
    me = admin(db, http)
    answer = me.post("/v1/models", json={"id": "bad", "upstream": {**UPSTREAM, **change}})
    assert (answer.status_code, answer.json()["code"]) == (422, code), answer.text
    assert me.get("/v1/models").json()["data"] == []


def test_an_upstream_needs_the_openai_engine(
    db: Database, http: TestClient[Any]  # noqa: F811
) -> None:
    me = admin(db, http)
    answer = me.post("/v1/models", json={"id": "x", "engine": "llama.cpp", "upstream": UPSTREAM})
    assert (answer.status_code, answer.json()["code"]) == (422, "unknown_engine")
    answer = me.post("/v1/models", json={"path": "x.gguf", "engine": "openai"})
    assert (answer.status_code, answer.json()["code"]) == (422, "upstream_required")


def test_allowed_hosts_refuse_other_hosts_at_registration(
    db: Database, settings: Settings
) -> None:
    narrowed = replace(settings, upstream_allowed_hosts="*.internal, 10.0.0.5")
    with TestClient(serving_app(narrowed)) as client:
        me = caller(db, client, "models:admin")
        refused = me.post("/v1/models", json={"id": "x", "upstream": {
            **UPSTREAM, "base_urls": ["http://169.254.169.254/v1"]}})
        assert (refused.status_code, refused.json()["code"]) == (422, "upstream_host_not_allowed")
        accepted = me.post("/v1/models", json={"id": "y", "upstream": UPSTREAM})
        assert accepted.status_code == 201, accepted.text


def test_the_cli_adds_and_lists_upstream_entries(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TASKWARD_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("TASKWARD_MODELS_DIR", str(settings.models_dir))
    added = CliRunner().invoke(main, [
        "models", "add-upstream", "smol", "--base-url", "http://127.0.0.1:9/v1",
        "--base-url", "http://127.0.0.1:10/v1", "--upstream-model", "smollm2",
        "--api-key-env", "SMOL_KEY", "--max-concurrency", "3", "--json"])
    assert added.exit_code == 0, added.output
    entry = json.loads(added.output)
    assert entry["upstream"]["base_urls"] == ["http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1"]
    assert (entry["upstream"]["max_concurrency"], entry["path"]) == (3, None)
    listed = CliRunner().invoke(main, ["models", "list", "--json"])
    assert [m["id"] for m in json.loads(listed.output)] == ["smol"]
    refused = CliRunner().invoke(main, ["models", "add-upstream", "bad", "--base-url",
                                        "gopher://x/v1", "--upstream-model", "m"])
    assert refused.exit_code != 0 and "invalid_upstream_url" in refused.output
