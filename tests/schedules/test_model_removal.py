"""`taskward models remove` tells the operator about the schedules it leaves firing
nothing: their slots pass without a task until the model is back (docs/cli.md)."""

from __future__ import annotations

from click.testing import CliRunner, Result

from core.models_registry import register
from core.settings import Settings
from core.store.database import Database
from infra.cli import main
from tests.schedules.helpers import add_schedule


def remove_model(runner: CliRunner, model_id: str) -> Result:
    return runner.invoke(main, ["models", "remove", model_id], catch_exceptions=False)


def test_removing_a_model_two_schedules_name_says_so_and_how_to_act(
    taskward: CliRunner, db: Database, settings: Settings, model_id: str
) -> None:
    (settings.models_dir / "other.bin").write_bytes(b"another model\n")
    register(db, settings.models_dir, "other.bin", model_id="other", engine="test.words")
    add_schedule(db, settings, model_id, "0 * * * *")
    add_schedule(db, settings, model_id, "30 * * * *", client="client-b")
    add_schedule(db, settings, "other", "0 * * * *")
    result = remove_model(taskward, model_id)
    assert result.exit_code == 0
    assert result.stdout == f"removed {model_id}\n"
    assert result.stderr == (
        f"2 schedule(s) still name {model_id} and create no task until it is registered "
        "again or they are removed (`taskward schedules list`, `taskward schedules remove`)\n")


def test_removing_a_model_no_schedule_names_prints_its_one_line(
    taskward: CliRunner, db: Database, settings: Settings, model_id: str
) -> None:
    result = remove_model(taskward, model_id)
    assert (result.exit_code, result.stdout, result.stderr) == (0, f"removed {model_id}\n", "")


def test_json_is_still_a_usage_error(taskward: CliRunner, model_id: str) -> None:
    result = taskward.invoke(main, ["models", "remove", model_id, "--json"])
    assert result.exit_code == 2
