"""`taskward.toml` has one spelling, and a value it gave is named by the file and its
key in every refusal (docs/settings.md), while a variable's value is named by the
variable. `LEASE_SECONDS = 45` was "unknown setting LEASE_SECONDS (TASKWARD_LEASE_SECONDS
is not one)", which is false, and a bad `sweep_schedule` or `heartbeat_seconds` of the
file was blamed on `TASKWARD_SWEEP_SCHEDULE` / `TASKWARD_HEARTBEAT_SECONDS`, variables
nobody had set."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.settings import SettingsError, load_settings
from tests.test_settings import clean_environment  # noqa: F401  autouse: no TASKWARD_*, cwd tmp


def refusal(tmp_path: Path, toml: str) -> str:
    (tmp_path / "taskward.toml").write_text(toml + "\n")
    with pytest.raises(SettingsError) as refused:
        load_settings()
    return str(refused.value)


@pytest.mark.parametrize(("line", "said"), [
    ("LEASE_SECONDS = 45", "LEASE_SECONDS: its keys are lower case; write lease_seconds"),
    ("Worker_Concurrency = 2",
     "Worker_Concurrency: its keys are lower case; write worker_concurrency"),
    ("taskward_lease_seconds = 2",
     "taskward_lease_seconds: its keys have no TASKWARD_ prefix; write lease_seconds"),
    ("TASKWARD_LEASE_SECONDS = 2", "TASKWARD_LEASE_SECONDS: its keys are lower case and "
                                   "have no TASKWARD_ prefix; write lease_seconds"),
])
def test_a_key_spelled_as_a_variable_is_refused_saying_what_to_write(
        tmp_path: Path, line: str, said: str) -> None:
    assert refusal(tmp_path, line) == f"taskward.toml: {said}"


@pytest.mark.parametrize("key", ["lease_secondz", "LEASE_SECONDZ", "upstream_\u212aey_envs"])
def test_a_key_that_is_no_setting_in_any_spelling_is_unknown(tmp_path: Path, key: str) -> None:
    # U+212A, the Kelvin sign, is `k` to `str.lower`: no look-alike is taken for a key.
    assert refusal(tmp_path, f'"{key}" = 1').startswith(f"taskward.toml: unknown setting {key} ")


@pytest.mark.parametrize(("line", "said"), [
    ('sweep_schedule = "61 * * * *"', "sweep_schedule: minute: '61' is outside 0-59"),
    ('database_url = "mysql://u:hunter2@db/x"',
     "database_url: mysql is neither sqlite nor postgresql; expected sqlite:///PATH or "
     "postgresql+psycopg://USER@HOST:PORT/DB"),
    ('models_dir = "~nosuchuser-taskward/m"',
     "models_dir: ~nosuchuser-taskward is no user's home directory here"),
    ('node_id = "a\\nb"', "node_id: holds U+000A, a control or other unprintable character; "
                          "it is written to logs and the store"),
    ("heartbeat_seconds = 40", "heartbeat_seconds must be shorter than lease_seconds"),
    ("lease_seconds = 5\nheartbeat_seconds = 6",
     "heartbeat_seconds must be shorter than lease_seconds"),
    ("max_attempts_default = 20", "max_attempts_default must not exceed max_attempts_cap"),
    ("backoff_max_seconds = 1", "backoff_base_seconds must not exceed backoff_max_seconds"),
    ("store_wait_seconds = 0.5", "store_wait_seconds: Expected `float` >= 1.0"),
])
def test_a_file_value_a_check_refuses_is_named_by_file_and_key(
        tmp_path: Path, line: str, said: str) -> None:
    assert refusal(tmp_path, line) == f"taskward.toml: {said}"


def test_a_pair_from_both_sources_names_each_by_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKWARD_LEASE_SECONDS", "20")
    assert refusal(tmp_path, "heartbeat_seconds = 40") == (
        "taskward.toml: heartbeat_seconds must be shorter than TASKWARD_LEASE_SECONDS")
    monkeypatch.delenv("TASKWARD_LEASE_SECONDS")
    monkeypatch.setenv("TASKWARD_HEARTBEAT_SECONDS", "20")
    assert refusal(tmp_path, "lease_seconds = 5") == (
        "TASKWARD_HEARTBEAT_SECONDS must be shorter than lease_seconds of taskward.toml")


def test_a_variable_that_wins_over_the_file_is_named_as_the_variable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKWARD_SWEEP_SCHEDULE", "61 * * * *")
    assert refusal(tmp_path, 'sweep_schedule = "* * * * *"') == (
        "TASKWARD_SWEEP_SCHEDULE: minute: '61' is outside 0-59")
    monkeypatch.setenv("TASKWARD_HEARTBEAT_SECONDS", "40")
    monkeypatch.setenv("TASKWARD_SWEEP_SCHEDULE", "* * * * *")
    assert refusal(tmp_path, "heartbeat_seconds = 5") == (
        "TASKWARD_HEARTBEAT_SECONDS must be shorter than TASKWARD_LEASE_SECONDS")
