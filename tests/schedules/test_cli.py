"""`taskward schedules list|add|remove`, through the real command group."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner, Result

from core.store.clients import create_client
from core.store.database import Database
from infra.cli import main


def run(runner: CliRunner, *args: str) -> Result:
    return runner.invoke(main, ["schedules", *args], catch_exceptions=False)


def add(runner: CliRunner, model: str, *extra: str) -> Result:
    request = json.dumps({"model": model, "input": "words=2"})
    return run(runner, "add", "--cron", "0 7 * * *", "--request", request, *extra)


def test_add_list_remove_round_trip_as_json(
    taskward: CliRunner, db: Database, model_id: str
) -> None:
    admin = create_client(db, name="admin", scopes=frozenset({"admin"}))
    added = add(taskward, model_id, "--catch-up", "2", "--json")
    assert added.exit_code == 0, added.output
    schedule = json.loads(added.output)
    assert (schedule["client_id"], schedule["catch_up"], schedule["cron"]) == (
        admin.client_id, 2, "0 7 * * *")
    listed = run(taskward, "list", "--json")
    assert [s["id"] for s in json.loads(listed.output)] == [schedule["id"]]
    assert run(taskward, "remove", schedule["id"]).exit_code == 0
    assert json.loads(run(taskward, "list", "--json").output) == []


def test_add_reads_the_request_from_a_file_for_a_chosen_client(
    taskward: CliRunner, db: Database, model_id: str, tmp_path: Path
) -> None:
    owner = create_client(db, name="reports", scopes=frozenset({"responses:create"}))
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"model": model_id, "input": "words=2"}))
    added = run(taskward, "add", "--cron", "@daily", "--request-file", str(request),
                "--client", owner.client_id, "--json")
    assert added.exit_code == 0, added.output
    assert json.loads(added.output)["client_id"] == owner.client_id
    table = run(taskward, "list", "--client", owner.client_id).output
    assert "0 0 * * *" in table and owner.client_id in table


def test_add_refuses_what_the_api_refuses_with_its_code(
    taskward: CliRunner, db: Database, model_id: str
) -> None:
    create_client(db, name="admin", scopes=frozenset({"admin"}))
    bad_cron = run(taskward, "add", "--cron", "0 0 30 2 *", "--request",
                   json.dumps({"model": model_id, "input": "x"}))
    assert bad_cron.exit_code != 0 and "invalid_cron" in bad_cron.output
    unknown_model = add(taskward, "no-such-model")
    assert unknown_model.exit_code != 0 and "model_not_found" in unknown_model.output
    not_json = run(taskward, "add", "--cron", "@daily", "--request", "{model")
    assert not_json.exit_code != 0 and "JSON" in not_json.output


def test_add_without_an_admin_client_says_how_to_make_one(
    taskward: CliRunner, model_id: str
) -> None:
    result = add(taskward, model_id)
    assert result.exit_code != 0 and "taskward pair --admin" in result.output


def test_remove_of_an_unknown_schedule_fails_cleanly(taskward: CliRunner) -> None:
    result = run(taskward, "remove", "sched_missing")
    assert result.exit_code == 1 and "schedule_not_found" in result.output


def test_add_refuses_a_client_without_the_scope_its_schedules_need(
    taskward: CliRunner, db: Database, model_id: str
) -> None:
    reader = create_client(db, name="reader", scopes=frozenset({"tasks:read", "tasks:cancel"}))
    refused = add(taskward, model_id, "--client", reader.client_id)
    assert refused.exit_code == 1
    assert refused.stderr.strip().splitlines() == [
        f"Error: client {reader.client_id} lacks the responses:create scope that owning "
        "schedules needs"]
    assert json.loads(run(taskward, "list", "--json").stdout) == []


def test_add_takes_an_admin_client_as_owner_for_it_holds_every_scope(
    taskward: CliRunner, db: Database, model_id: str
) -> None:
    admin = create_client(db, name="ops", scopes=frozenset({"admin"}))
    added = add(taskward, model_id, "--client", admin.client_id, "--json")
    assert added.exit_code == 0, added.output
    assert json.loads(added.stdout)["client_id"] == admin.client_id


def test_list_pages_with_after_and_names_the_next_page_on_stderr(
    taskward: CliRunner, db: Database, model_id: str
) -> None:
    create_client(db, name="admin", scopes=frozenset({"admin"}))
    made = [json.loads(add(taskward, model_id, "--json").stdout)["id"] for _ in range(3)]
    first = run(taskward, "list", "--limit", "2", "--json")
    assert [s["id"] for s in json.loads(first.stdout)] == made[:0:-1]
    assert first.stderr == f"next page: --after {made[1]}\n"
    second = run(taskward, "list", "--limit", "2", "--after", made[1], "--json")
    assert [s["id"] for s in json.loads(second.stdout)] == [made[0]]
    assert second.stderr == ""
    table = run(taskward, "list", "--limit", "2")
    assert made[2] in table.stdout and made[0] not in table.stdout
    assert table.stderr == f"next page: --after {made[1]}\n"


def test_list_refuses_an_after_that_is_no_id_as_a_usage_error(taskward: CliRunner) -> None:
    refused = run(taskward, "list", "--after", "x\x00y")
    assert refused.exit_code == 2 and "--after" in refused.stderr
