"""An upstream entry's `api_key_env` never makes a sweeper send taskward's own settings
or libpq's variables (the store's credentials) to servers a `models:admin` client
chose, and `TASKWARD_UPSTREAM_KEY_ENVS` narrows the names it may take: refused at
registration (API and CLI alike) and again at use, on both stores. What is sent is
observed on a real listener on a loopback port."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from click.testing import CliRunner
from litestar.testing import TestClient

from core.models_registry import UPSTREAM_ENGINE
from core.settings import Settings
from core.states import Status
from core.store.database import Database
from core.store.models import insert_model
from infra.app import serving_app
from infra.cli import main
from tests.api.conftest import http  # noqa: F401  (fixture shared with tests/api)
from tests.api.helpers import caller
from tests.store.helpers import task_row
from tests.upstream.helpers import MODEL, add_upstream, enqueue
from tests.upstream.test_errors import run_until_finished

SECRET = "postgresql+psycopg://taskward:store-password@db/taskward"


class Listener:
    """A loopback HTTP server that records each request's Authorization header and
    answers 400, so an attempt that reaches it fails at once (`upstream_rejected`)."""

    def __init__(self) -> None:
        self.authorizations: list[str | None] = []
        seen = self.authorizations

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                seen.append(self.headers.get("authorization"))
                self.send_response(400)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener()
    yield server
    server.stop()


def upstream(api_key_env: str) -> dict[str, Any]:
    return {"base_urls": ["http://127.0.0.1:9/v1"], "model": "m", "api_key_env": api_key_env}


@pytest.mark.parametrize("name", ["TASKWARD_DATABASE_URL", "taskward_database_url",
                                  "PGPASSWORD", "PGPASSFILE"])
def test_the_api_refuses_a_key_variable_holding_the_stores_credentials(
    db: Database, http: TestClient[Any], name: str  # noqa: F811
) -> None:
    me = caller(db, http, "models:admin", "models:read")
    answer = me.post("/v1/models", json={"id": "x", "upstream": upstream(name)})
    assert (answer.status_code, answer.json()["code"]) == (422, "invalid_api_key_env")
    assert "store's credentials" in answer.json()["detail"]
    assert me.get("/v1/models").json()["data"] == []


def test_the_api_accepts_an_ordinary_key_variable(
    db: Database, http: TestClient[Any]  # noqa: F811
) -> None:
    me = caller(db, http, "models:admin")
    answer = me.post("/v1/models", json={"id": "x", "upstream": upstream("OPENAI_API_KEY")})
    assert answer.status_code == 201, answer.text


def test_the_cli_refuses_a_key_variable_holding_the_stores_credentials(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TASKWARD_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("TASKWARD_MODELS_DIR", str(settings.models_dir))
    refused = CliRunner().invoke(main, [
        "models", "add-upstream", "x", "--base-url", "http://127.0.0.1:9/v1",
        "--upstream-model", "m", "--api-key-env", "TASKWARD_DATABASE_URL"])
    assert refused.exit_code != 0 and "invalid_api_key_env" in refused.output
    listed = CliRunner().invoke(main, ["models", "list", "--json"])
    assert json.loads(listed.output) == []


def test_the_allow_list_refuses_other_names_at_registration(
    db: Database, settings: Settings
) -> None:
    narrowed = replace(settings, upstream_key_envs="OPENAI_API_KEY, VLLM_*")
    with TestClient(serving_app(narrowed)) as client:
        me = caller(db, client, "models:admin")
        refused = me.post("/v1/models", json={"id": "x", "upstream": upstream("HOME")})
        assert (refused.status_code, refused.json()["code"]) == (422, "invalid_api_key_env")
        assert "TASKWARD_UPSTREAM_KEY_ENVS" in refused.json()["detail"]
        for model_id, name in (("y", "OPENAI_API_KEY"), ("z", "VLLM_GPU_KEY")):
            accepted = me.post("/v1/models", json={"id": model_id, "upstream": upstream(name)})
            assert accepted.status_code == 201, accepted.text


def test_the_allow_list_does_not_reopen_the_stores_credentials(
    db: Database, settings: Settings
) -> None:
    opened = replace(settings, upstream_key_envs="*")
    with TestClient(serving_app(opened)) as client:
        me = caller(db, client, "models:admin")
        refused = me.post("/v1/models", json={"id": "x",
                                              "upstream": upstream("TASKWARD_DATABASE_URL")})
        assert (refused.status_code, refused.json()["code"]) == (422, "invalid_api_key_env")


def test_a_stored_entry_naming_a_setting_never_sends_its_value(
    db: Database, settings: Settings, listener: Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TASKWARD_DATABASE_URL", SECRET)
    insert_model(db, {  # as an entry registered before the rule was stored
        "id": MODEL, "engine": UPSTREAM_ENGINE, "path": None, "size_bytes": None,
        "sha256": None, "metadata_json": "{}", "max_concurrency": 4,
        "upstream_json": json.dumps({"base_urls": [listener.base_url], "model": "m",
                                     "api_key_env": "TASKWARD_DATABASE_URL",
                                     "timeout_seconds": 5})})
    [task_id] = enqueue(db, max_output_tokens=4)

    run_until_finished(db, settings, task_id)

    row = task_row(db, task_id)
    assert (row.status, row.error_code, row.attempts) == (Status.FAILED, "upstream_key_missing", 1)
    assert listener.authorizations == []
    assert "store-password" not in (row.error_message or "")


def test_the_allow_list_refuses_other_names_at_use(
    db: Database, settings: Settings, listener: Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SOME_SECRET", "not-for-upstreams")
    add_upstream(db, [listener.base_url], api_key_env="SOME_SECRET")  # before the setting

    [task_id] = enqueue(db, max_output_tokens=4)
    run_until_finished(db, replace(settings, upstream_key_envs="OPENAI_*"), task_id)

    row = task_row(db, task_id)
    assert (row.status, row.error_code) == (Status.FAILED, "upstream_key_missing")
    assert listener.authorizations == []


def test_an_allowed_key_variable_is_sent(
    db: Database, settings: Settings, listener: Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listener sees what an attempt sends: the checks above are not vacuous."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-allowed")
    add_upstream(db, [listener.base_url], api_key_env="OPENAI_API_KEY")
    [task_id] = enqueue(db, max_output_tokens=4)

    run_until_finished(db, replace(settings, upstream_key_envs="OPENAI_*"), task_id)

    assert task_row(db, task_id).error_code == "upstream_rejected"
    assert listener.authorizations == ["Bearer sk-allowed"]
