"""The default model as an operator registers it for `taskward serve` + `taskward
sweeper` (`taskward models add`), and the seed a response object shows: run on the real
model, each task alone (batching may change sampled text, docs/operations.md)."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner
from litestar.testing import TestClient

from core.model_files import install_default_model
from core.models_registry import register
from core.settings import Settings
from core.store.database import Database
from infra.app import serving_app
from infra.cli import main
from tests.api.helpers import Caller, caller
from tests.scheduler.helpers import run_pass

pytestmark = pytest.mark.model

LIMIT = 64


@pytest.fixture
def http(settings: Settings) -> Any:
    with TestClient(serving_app(settings)) as client:
        yield client


@pytest.fixture
def alice(db: Database, http: TestClient[Any]) -> Caller:
    return caller(db, http, "responses:create", "tasks:read")


def answered(db: Database, settings: Settings, alice: Caller, **body: Any) -> dict[str, Any]:
    """The finished response object of one task, run alone by a sweeper pass."""
    task_id = alice.post("/v1/responses", json=body).json()["id"]
    assert run_pass(db, settings)["completed"] == 1
    response: dict[str, Any] = alice.get(f"/v1/responses/{task_id}").json()
    return response


def text_of(response: dict[str, Any]) -> str:
    return "".join(part["text"] for part in response["output"][0]["content"])


@pytest.mark.parametrize("seed", [1, 2])
def test_say_hello_to_the_default_model_registered_by_models_add_does_not_loop(
    db: Database, settings: Settings, alice: Caller, monkeypatch: pytest.MonkeyPatch,
    seed: int,
) -> None:
    path = install_default_model(settings.models_dir)
    monkeypatch.setenv("TASKWARD_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("TASKWARD_MODELS_DIR", str(settings.models_dir))
    monkeypatch.chdir(settings.models_dir)
    added = CliRunner().invoke(main, ["models", "add", str(path), "--id", "smol"])
    assert added.exit_code == 0, added.output

    response = answered(db, settings, alice, model="smol", input="Say hello.",
                        max_output_tokens=LIMIT, seed=seed)

    assert response["status"] == "completed"
    assert response["usage"]["output_tokens"] < LIMIT, text_of(response)


def test_the_seed_a_response_shows_gives_its_text_again(
    db: Database, settings: Settings, alice: Caller
) -> None:
    path = install_default_model(settings.models_dir)
    register(db, settings.models_dir, path, model_id="hot", engine="llama.cpp",
             metadata={"temperature": "1.5", "top_p": "1"})
    body = {"model": "hot", "input": "Write a haiku.", "max_output_tokens": 16}

    first = answered(db, settings, alice, **body)
    again = answered(db, settings, alice, **body, seed=first["seed"])
    other = answered(db, settings, alice, **body, seed=first["seed"] ^ 1)

    assert isinstance(first["seed"], int) and again["seed"] == first["seed"]
    assert text_of(again) == text_of(first)
    assert text_of(other) != text_of(first)  # the seed shown is the one that decided
