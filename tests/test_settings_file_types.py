"""`taskward.toml` is as strict as the environment (docs/settings.md): a value must be
of its setting's TOML type, and a refusal names the file and the key. The file's values
went through the environment's lax conversion: `worker_concurrency = 2.0` and
`lease_seconds = "30"` were taken where `TASKWARD_WORKER_CONCURRENCY=2.0` is refused."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest
from click.testing import CliRunner

from core.settings import Settings, SettingsError, load_settings
from infra.cli import main
from tests.test_settings import clean_environment  # noqa: F401  autouse: no TASKWARD_*, cwd tmp


@pytest.mark.parametrize(("line", "said"), [
    ("worker_concurrency = 2.0", "worker_concurrency must be an integer, not a float"),
    ('worker_concurrency = "2"', "worker_concurrency must be an integer, not a string"),
    ("worker_concurrency = true", "worker_concurrency must be an integer, not a boolean"),
    ('lease_seconds = "30"', "lease_seconds must be a number, not a string"),
    ("lease_seconds = 1979-05-27", "lease_seconds must be a number, not a date or time"),
    ("node_id = 7", "node_id must be a string, not an integer"),
    ('models_dir = ["models"]', "models_dir must be a string, not an array"),
])
def test_a_file_value_not_of_its_settings_type_is_refused_naming_file_and_key(
        tmp_path: Path, line: str, said: str) -> None:
    (tmp_path / "taskward.toml").write_text(line + "\n")
    with pytest.raises(SettingsError) as refused:
        load_settings()
    assert str(refused.value) == f"taskward.toml: {said}"


def test_a_file_value_of_the_wrong_type_is_refused_though_the_environment_sets_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "taskward.toml").write_text("worker_concurrency = 2.0\n")
    monkeypatch.setenv("TASKWARD_WORKER_CONCURRENCY", "4")
    with pytest.raises(SettingsError, match="^taskward.toml: worker_concurrency must be an "):
        load_settings()


def test_every_default_written_in_its_toml_type_is_taken(tmp_path: Path) -> None:
    defaults = Settings()
    written = {setting.name: getattr(defaults, setting.name) for setting in fields(Settings)}
    (tmp_path / "taskward.toml").write_text("".join(
        f"{name} = {json.dumps(str(value) if isinstance(value, Path) else value)}\n"
        for name, value in written.items()))
    assert load_settings() == defaults


def test_a_file_value_past_its_bound_is_named_by_file_and_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "taskward.toml").write_text("worker_concurrency = 0\n")
    with pytest.raises(SettingsError) as refused:
        load_settings()
    assert str(refused.value) == "taskward.toml: worker_concurrency: Expected `int` >= 1"
    monkeypatch.setenv("TASKWARD_WORKER_CONCURRENCY", "0")  # the value in force: its source
    with pytest.raises(SettingsError, match=r"^TASKWARD_WORKER_CONCURRENCY: Expected `int` >= 1$"):
        load_settings()


def test_a_command_beside_such_a_file_exits_1_naming_it(tmp_path: Path) -> None:
    (tmp_path / "taskward.toml").write_text('lease_seconds = "30"\n')
    result = CliRunner().invoke(main, ["tasks", "list"])
    assert (result.exit_code, result.output) == (
        1, "Error: configuration error: taskward.toml: lease_seconds must be a number, "
           "not a string\n")
    assert list(tmp_path.iterdir()) == [tmp_path / "taskward.toml"]
