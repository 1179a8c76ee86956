"""`taskward schedules add --request / --request-file` with hostile input, on both
stores: decoded and bounded as `POST /v1/schedules` decodes its body, refused in one
line (never a traceback, a hang or an unbounded read)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from core.settings import Settings
from core.store.clients import create_client
from core.store.database import Database
from infra.cli import main
from tests.api.served import TASKWARD, service_env

DEEP = "[" * 50_000 + "]" * 50_000


@pytest.fixture
def taskward(
    settings: Settings, db: Database, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> CliRunner:
    monkeypatch.chdir(tmp_path)  # no taskward.toml of the developer's
    monkeypatch.setenv("TASKWARD_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("TASKWARD_MODELS_DIR", str(settings.models_dir))
    create_client(db, name="admin", scopes=frozenset({"admin"}))
    return CliRunner()


def add(runner: CliRunner, *args: str) -> Result:
    return runner.invoke(main, ["schedules", "add", "--cron", "@daily", *args],
                         catch_exceptions=False)


def _refused(result: Result, option: str, reason: str) -> None:
    assert result.exit_code == 2, result.output
    assert f"Invalid value for {option}: {reason}" in result.output


def _no_schedule(runner: CliRunner) -> None:
    listed = runner.invoke(main, ["schedules", "list", "--json"], catch_exceptions=False)
    assert json.loads(listed.output) == []


def test_a_request_nested_too_deep_is_json_too_deep(
    taskward: CliRunner, tmp_path: Path
) -> None:
    _refused(add(taskward, "--request", DEEP), "--request", "json_too_deep: ")
    (tmp_path / "deep.json").write_text(DEEP)
    _refused(add(taskward, "--request-file", str(tmp_path / "deep.json")), "--request-file",
             "json_too_deep: ")
    _no_schedule(taskward)


@pytest.mark.parametrize("text", [
    '{"model": "words", "input": "\\ud800"}',  # a lone surrogate, escaped
    '{"model": "words", "input": "\udcff"}',  # an invalid byte as argv decodes it
    "{model",
])
def test_a_request_the_api_answers_malformed_json_is_malformed_json(
    taskward: CliRunner, model_id: str, text: str
) -> None:
    _refused(add(taskward, "--request", text), "--request", "malformed_json: ")
    _no_schedule(taskward)


def test_a_request_file_over_the_body_limit_is_body_too_large(
    taskward: CliRunner, model_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TASKWARD_MAX_BODY_BYTES", "1024")
    request = tmp_path / "big.json"
    request.write_text(json.dumps({"model": model_id, "input": "x" * 2000}))
    _refused(add(taskward, "--request-file", str(request)), "--request-file",
             "body_too_large: more than TASKWARD_MAX_BODY_BYTES (1024 bytes)")
    request.write_text(json.dumps({"model": model_id, "input": "x" * 900}))
    assert add(taskward, "--request-file", str(request)).exit_code == 0


def test_a_nul_in_the_model_is_refused_in_one_line_on_either_store(
    taskward: CliRunner, model_id: str, settings: Settings
) -> None:
    """PostgreSQL refuses a NUL in text (the API answers 422 validation_error); SQLite
    stores it, and no such model exists."""
    result = add(taskward, "--request", json.dumps({"model": model_id + "\0", "input": "x"}))
    expected = ("validation_error: a value contains a character that cannot be stored"
                if settings.database_url.startswith("postgresql") else "model_not_found: ")
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert result.output.startswith(f"Error: {expected}")
    assert len(result.output.strip().splitlines()) == 1
    _no_schedule(taskward)


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_a_request_file_that_is_not_a_regular_file_is_refused_unread(
    taskward: CliRunner, settings: Settings, tmp_path: Path, kind: str
) -> None:
    """A FIFO without a writer would block the read for ever, /dev/zero never ends:
    through a real process, so a hang is a timeout rather than a stuck suite."""
    if kind == "fifo":
        path = tmp_path / "request.fifo"
        os.mkfifo(path)
    else:
        path = Path("/dev/zero")
    done = subprocess.run(
        [TASKWARD, "schedules", "add", "--cron", "@daily", "--request-file", str(path)],
        env=service_env(settings.database_url, settings.models_dir), cwd=tmp_path,
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "Invalid value for --request-file: not a regular file" in done.stderr
    assert "Traceback" not in done.stderr
