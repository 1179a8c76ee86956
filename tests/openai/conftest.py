"""Fixtures of the OpenAI-compatibility tests.

`sdk` is the official `openai` package pointed at a real `taskward run` (SQLite, the
deterministic `test.words` engine registered as `words`, a random loopback port),
started once for the module; `tokens` pairs a fresh client for a test that counts its
own tasks. The route tests reuse the TestClient fixtures of `tests/api`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import openai
import pytest

from tests.api.conftest import alice, bob, http  # noqa: F401  (fixtures shared with tests/api)
from tests.api.served import Service, process, service_env, wait_ready
from tests.databases import copy_sqlite
from tests.scheduler.processes import free_port

MODEL = "words"
SCOPES = "responses:create,tasks:read,tasks:cancel,models:read"
# Short backoff, so a retried task's second attempt starts within the test's patience.
SETTINGS = {"TASKWARD_BACKOFF_BASE_SECONDS": "0.05", "TASKWARD_BACKOFF_MAX_SECONDS": "0.2"}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path) -> Iterator[Service]:
    """`taskward run` with the test engine's model added by `taskward models add`."""
    workdir = tmp_path_factory.mktemp("openai")
    url = copy_sqlite(sqlite_template, workdir / "taskward.db")
    env = {**service_env(url, workdir / "models"), **SETTINGS}
    (workdir / "models").mkdir()
    model_file = workdir / "models" / "words.bin"  # files are registered from inside the dir
    model_file.write_bytes(b"test.words model file\n")
    port = free_port()
    service = Service(f"http://127.0.0.1:{port}", env)
    service.cli("models", "add", str(model_file), "--id", MODEL, "--engine", "test.words")
    with ExitStack() as stack:
        log = workdir / "run.log"
        child = stack.enter_context(process(["run", "--port", str(port)], env, log))
        wait_ready(service.base_url, child, log)
        yield service


@pytest.fixture(scope="module")
def tokens(served: Service) -> Callable[[], str]:
    """A new client's bearer token each call (its task list starts empty)."""
    def issue() -> str:
        issued = served.cli_json("pair", "--scopes", SCOPES, "--token")
        assert isinstance(issued, dict)
        return str(issued["token"])

    return issue


@pytest.fixture(scope="module")
def sdk(served: Service, tokens: Callable[[], str]) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{served.base_url}/v1", api_key=tokens(),
                       timeout=30) as client:
        yield client
