"""What `taskward pair`, `clients set` and `models add` refuse, on both stores: the
API's own bounds and name rule (never an overflow traceback or a value the API would
refuse), and a model file still being written; and what `taskward sweeper` refuses of
its options."""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from core.settings import Settings
from infra.cli import main
from tests.api.served import TASKWARD, service_env


@pytest.fixture
def taskward(settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    monkeypatch.chdir(tmp_path)  # no taskward.toml of the developer's
    monkeypatch.setenv("TASKWARD_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("TASKWARD_MODELS_DIR", str(settings.models_dir))

    def invoke(*args: str) -> Result:
        return CliRunner().invoke(main, list(args), catch_exceptions=False)

    return invoke


def _usage_error(result: Result, option: str, reason: str) -> None:
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}': " in result.output and reason in result.output


@pytest.mark.parametrize(("option", "value", "reason"), [
    ("--max-active-tasks", "9223372036854775808", "is not in the range 0<=x<=1000000000"),
    ("--max-active-tasks", "2147483648", "is not in the range 0<=x<=1000000000"),
    ("--max-active-tasks", "-1", "is not in the range 0<=x<=1000000000"),
    ("--max-streams", "9223372036854775808", "is not in the range 1<=x<=1000000"),
    ("--max-streams", "0", "is not in the range 1<=x<=1000000"),
    ("--requests-per-second", "nan", "is not a number"),
    ("--requests-per-second", "inf", "is not in the range 0<=x<=1000000"),
    ("--requests-per-second", "1e309", "is not in the range 0<=x<=1000000"),
])
def test_pair_and_clients_set_refuse_a_limit_outside_the_apis_bounds(
    taskward: Any, option: str, value: str, reason: str
) -> None:
    _usage_error(taskward("pair", "--token", option, value, "--json"), option, reason)
    client = json.loads(taskward("pair", "--token", "--json").output)["client_id"]
    _usage_error(taskward("clients", "set", client, option, value, "--json"), option, reason)
    [shown] = json.loads(taskward("clients", "list", "--json").output)
    assert (shown["max_active_tasks"], shown["requests_per_second"],
            shown["max_streams"]) == (None, None, None)


def test_limits_at_the_apis_upper_bounds_are_stored_and_read_back(taskward: Any) -> None:
    issued = taskward("pair", "--token", "--max-active-tasks", "1000000000",
                      "--requests-per-second", "1000000", "--max-streams", "1000000", "--json")
    assert issued.exit_code == 0, issued.output
    [shown] = json.loads(taskward("clients", "list", "--json").output)
    assert (shown["max_active_tasks"], shown["requests_per_second"],
            shown["max_streams"]) == (10**9, 1e6, 10**6)


def test_a_negative_zero_rate_is_stored_and_listed_as_zero(taskward: Any) -> None:
    issued = taskward("pair", "--token", "--requests-per-second", "-0.0", "--json")
    assert issued.exit_code == 0, issued.output
    listed = taskward("clients", "list", "--json").output
    assert '"requests_per_second": 0.0' in listed and "-0.0" not in listed


@pytest.mark.parametrize("name", [
    "x\ny\rz\x1b[31m", "tab\there", "csi\x9b31m", "", "n" * 100_000,
], ids=["c0-controls", "tab", "c1-csi", "empty", "too-long"])
@pytest.mark.parametrize("direct", [True, False], ids=["token", "code"])
def test_pair_refuses_a_name_post_v1_pair_refuses(
    taskward: Any, name: str, direct: bool
) -> None:
    args = ["pair", "--name", name, "--json", *(["--token"] if direct else [])]
    _usage_error(taskward(*args), "--name", "1..200 characters, no control character")
    assert json.loads(taskward("clients", "list", "--json").output) == []


def test_clients_set_refuses_a_value_and_a_default_for_the_same_limit(taskward: Any) -> None:
    client = json.loads(taskward("pair", "--token", "--max-streams", "2",
                                 "--json").output)["client_id"]
    refused = taskward("clients", "set", client, "--default", "max_streams",
                       "--max-streams", "5", "--json")
    assert refused.exit_code == 2
    assert "--max-streams and --default max_streams contradict each other" in refused.output
    [shown] = json.loads(taskward("clients", "list", "--json").output)
    assert shown["max_streams"] == 2


def test_models_add_refuses_a_name_too_long_for_the_file_system_in_one_line(
    taskward: Any
) -> None:
    result = taskward("models", "add", "a" * 300, "--engine", "test.words")
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert result.output.startswith("Error: model_file_unreadable: ")
    assert len(result.output.strip().splitlines()) == 1


def test_models_add_refuses_a_file_that_grows_while_it_is_hashed(
    settings: Settings, tmp_path: Path
) -> None:
    """A real writer appends while a real `taskward models add` hashes: the file is
    refused (every task would fail its digest check), and registers once complete."""
    path = settings.models_dir / "grow.gguf"
    with path.open("wb") as file:
        file.write(b"GGUF" + struct.pack("<IQQ", 3, 0, 0))  # a whole GGUF header, no tensors
        file.truncate(96 << 20)  # enough for ~100 ms of hashing
    done = threading.Event()

    def append() -> None:
        with path.open("ab") as file:
            while not done.wait(0.001):
                file.write(b"w" * 16384)
                file.flush()

    env = service_env(settings.database_url, settings.models_dir)
    writer = threading.Thread(target=append)
    writer.start()
    try:
        added = subprocess.run([TASKWARD, "models", "add", "grow.gguf", "--json"], env=env,
                               cwd=tmp_path, capture_output=True, text=True, timeout=120)
    finally:
        done.set()
        writer.join()
    assert (added.returncode, added.stdout) == (1, ""), added.stderr
    assert added.stderr.startswith("Error: model_file_changed: ")
    assert "register it once it is complete" in added.stderr
    assert len(added.stderr.strip().splitlines()) == 1

    complete = subprocess.run([TASKWARD, "models", "add", "grow.gguf", "--json"], env=env,
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert complete.returncode == 0, complete.stderr
    entry = json.loads(complete.stdout)
    data = path.read_bytes()
    assert (entry["size_bytes"], entry["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())


@pytest.mark.parametrize("schedule", ["bad cron", "", "* * * * * *", "0 0 30 2 *"])
def test_sweeper_refuses_a_bad_schedule_as_a_usage_error_naming_the_option(
    tmp_path: Path, schedule: str
) -> None:
    """It was `configuration error: TASKWARD_SWEEP_SCHEDULE: …`, exit 1: blamed on a
    variable nobody had set."""
    store = tmp_path / "taskward.db"
    env = service_env(f"sqlite:///{store}", tmp_path)
    done = subprocess.run([TASKWARD, "sweeper", "--schedule", schedule], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "Error: Invalid value for '--schedule': " in done.stderr
    assert "TASKWARD_SWEEP_SCHEDULE" not in done.stderr
    assert not store.exists()  # refused before anything was opened


def test_sweeper_takes_a_good_schedule_as_its_maintenance_schedule(tmp_path: Path) -> None:
    """Accepted, it goes on to the store, whose absence (none yet) then stops it."""
    env = service_env(f"sqlite:///{tmp_path}/taskward.db", tmp_path)
    done = subprocess.run([TASKWARD, "sweeper", "--schedule", "*/5 * * * *"], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "run `taskward migrate` first" in done.stderr
