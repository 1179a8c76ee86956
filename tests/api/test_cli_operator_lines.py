"""Operator-facing lines of the CLI: usage errors naming the option, refusals saying
what to do next, `run`'s URL and start-up refusal, and the hashing progress of
`models add`. Run in-process on both stores."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from core.settings import Settings
from infra.cli import main
from infra.cli import operator as operator_commands
from infra.cli.listen_address import url_authority


@pytest.fixture
def taskward(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("TASKWARD_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("TASKWARD_MODELS_DIR", str(settings.models_dir))

    def invoke(*args: str) -> Any:
        return CliRunner().invoke(main, list(args))

    return invoke


@pytest.mark.parametrize(("args", "option"), [
    (("schedules", "add", "--cron", "0 0 * *", "--request", '{"model":"m","input":"x"}'),
     "--cron"),
    (("pair", "--scopes", "bogus"), "--scopes"),
    (("pair", "--scopes", ""), "--scopes"),
    (("models", "add-upstream", "m", "--base-url", "http://127.0.0.1:1/v1",
      "--upstream-model", "m", "--max-concurrency", "0"), "--max-concurrency"),
])
def test_a_bad_option_value_is_a_usage_error_naming_the_option(
        taskward: Any, args: tuple[str, ...], option: str) -> None:
    result = taskward(*args)
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}'" in result.output


def test_a_good_scope_list_still_pairs(taskward: Any) -> None:
    result = taskward("pair", "--scopes", "tasks:read, models:read", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["scopes"] == ["models:read", "tasks:read"]


def test_an_unknown_client_points_to_clients_list(taskward: Any) -> None:
    result = taskward("clients", "revoke", "cl_nosuchclient")
    assert result.exit_code == 1
    assert "client_not_found" in result.output and "taskward clients list" in result.output


def test_a_model_outside_the_models_dir_names_the_directory(
        taskward: Any, settings: Settings, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.gguf"
    outside.write_bytes(b"weights")
    result = taskward("models", "add", str(outside), "--engine", "test.words")
    assert result.exit_code == 1
    assert "model_path_outside_models_dir" in result.output
    assert str(settings.models_dir) in result.output and "copy" in result.output


def test_a_slow_hash_shows_progress_on_stderr_only(
        taskward: Any, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(operator_commands, "_SILENT_HASH_SECONDS", 0.0)
    (settings.models_dir / "big.bin").write_bytes(b"\0" * (3 << 20))
    result = taskward("models", "add", str(settings.models_dir / "big.bin"), "--id", "big",
                      "--engine", "test.words", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["id"] == "big"
    assert "hashing " in result.stderr and "/0.0 GB" in result.stderr


def test_a_quick_hash_is_silent(taskward: Any, settings: Settings) -> None:
    (settings.models_dir / "small.bin").write_bytes(b"weights")
    result = taskward("models", "add", str(settings.models_dir / "small.bin"),
                      "--engine", "test.words")
    assert result.exit_code == 0, result.output
    assert result.stderr == ""


def test_run_refuses_an_unwritable_models_dir_in_one_line(
        settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("TASKWARD_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("TASKWARD_MODELS_DIR", str(blocker / "models"))
    result = CliRunner().invoke(main, ["run", "--port", "0"])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)
    assert "models_dir_unwritable" in result.output
    assert str(blocker / "models") in result.output and "writable" in result.output


def test_an_ipv6_host_is_bracketed_in_a_url() -> None:
    assert url_authority("::1", 8000) == "[::1]:8000"
    assert url_authority("127.0.0.1", 8000) == "127.0.0.1:8000"


def test_run_prints_an_ipv6_url_in_brackets(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    import infra.runtime

    monkeypatch.setattr(infra.runtime, "serve_all_in_one", lambda **_: None)
    monkeypatch.setenv("TASKWARD_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("TASKWARD_MODELS_DIR", str(settings.models_dir))
    result = CliRunner().invoke(main, ["run", "--host", "::1", "--port", "0"])
    assert result.exit_code == 0, result.output
    assert "serving on http://[::1]:" in result.output
