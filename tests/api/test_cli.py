"""The operator commands of docs/cli.md, run in-process on both stores."""

from __future__ import annotations

import ast
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from core.settings import Settings
from core.store import claims, worker_writes
from core.store.births import NewTask
from core.store.database import Database
from core.store.new_tasks import enqueue
from infra.cli import main
from tests.api.helpers import complete_due, register_test_model
from tests.api.served import TASKWARD
from tests.scheduler.processes import free_port


@pytest.fixture
def run(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("TASKWARD_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("TASKWARD_MODELS_DIR", str(settings.models_dir))

    def invoke(*args: str) -> Any:
        result = CliRunner().invoke(main, list(args), catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return json.loads(result.output) if "--json" in args else result.output

    return invoke


def test_pair_prints_a_code(run: Any) -> None:
    code = run("pair", "--scopes", "tasks:read,models:read", "--json")
    assert set(code) == {"id", "code", "expires_at", "scopes"}
    assert code["scopes"] == ["models:read", "tasks:read"]
    assert code["code"].startswith(code["id"] + "-")
    assert [c["id"] for c in run("pairing-codes", "list", "--json")] == [code["id"]]


def test_pair_with_token_creates_the_client_at_once(run: Any) -> None:
    issued = run("pair", "--admin", "--token", "--name", "root", "--json")
    assert set(issued) == {"client_id", "token", "scopes"} and issued["scopes"] == ["admin"]
    listed = run("clients", "list", "--json")
    assert [(c["id"], c["name"]) for c in listed] == [(issued["client_id"], "root")]


def test_clients_revoke(run: Any) -> None:
    issued = run("pair", "--token", "--json")
    run("clients", "revoke", issued["client_id"])
    assert run("clients", "list", "--json")[0]["revoked_at"] is not None


def test_unknown_scopes_stop_pair(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKWARD_DATABASE_URL", settings.database_url)
    result = CliRunner().invoke(main, ["pair", "--scopes", "everything"])
    assert result.exit_code != 0 and "unknown_scope" in result.output


def test_models_add_list_remove(run: Any, settings: Settings) -> None:
    (settings.models_dir / "tiny.gguf").write_bytes(b"weights")
    entry = run("models", "add", str(settings.models_dir / "tiny.gguf"), "--id", "tiny",
                "--engine", "test.words", "--json")
    assert (entry["id"], entry["engine"], entry["path"]) == ("tiny", "test.words", "tiny.gguf")
    assert [m["id"] for m in run("models", "list", "--json")] == ["tiny"]
    run("models", "remove", "tiny")
    assert run("models", "list", "--json") == []
    assert (settings.models_dir / "tiny.gguf").is_file()


def test_tasks_list_show_cancel(run: Any, db: Database, settings: Settings) -> None:
    model = register_test_model(db, settings.models_dir)
    first = enqueue(db, NewTask(client_id="c", model=model, request_json="{}")).task_id
    second = enqueue(db, NewTask(client_id="c", model=model, request_json="{}")).task_id
    complete_due(db)
    third = enqueue(db, NewTask(client_id="c", model=model, request_json="{}")).task_id
    assert [t["id"] for t in run("tasks", "list", "--json")] == [third, second, first]
    assert [t["id"] for t in run("tasks", "list", "--status", "queued", "--json")] == [third]
    assert run("tasks", "show", first, "--json")["status"] == "completed"
    assert run("tasks", "cancel", third, "--json")["status"] == "cancelled"
    assert "task_already_finished" in CliRunner().invoke(main, ["tasks", "cancel", first]).output


def test_dead_letters_list_and_retry(run: Any, db: Database, settings: Settings) -> None:
    model = register_test_model(db, settings.models_dir)
    failed = enqueue(db, NewTask(client_id="c", model=model, request_json="{}",
                                 max_attempts=1)).task_id
    (claim,) = claims.claim(db, limit=1, lease_ms=60_000, node_id="test")
    worker_writes.requeue(db, failed, claim.owner_token, delay_ms=0, code="engine_error",
                          message="x")
    assert [t["id"] for t in run("dead-letters", "list", "--json")] == [failed]
    fresh = run("dead-letters", "retry", failed, "--json")
    assert fresh["id"] != failed and fresh["status"] == "queued"


def test_models_add_refuses_a_symlink_loop_without_a_traceback(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TASKWARD_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("TASKWARD_MODELS_DIR", str(settings.models_dir))
    monkeypatch.chdir(settings.models_dir)
    (settings.models_dir / "a.gguf").symlink_to(settings.models_dir / "b.gguf")
    (settings.models_dir / "b.gguf").symlink_to(settings.models_dir / "a.gguf")
    result = CliRunner().invoke(main, ["models", "add", "a.gguf", "--engine", "test.words"])
    assert result.exit_code == 1 and result.exception is not None
    assert "model_file_unreadable" in result.output
    assert isinstance(result.exception, SystemExit)  # click's clean exit, not a crash


def test_tasks_list_survives_a_time_beyond_the_calendar(
    run: Any, db: Database, settings: Settings
) -> None:
    register_test_model(db, settings.models_dir)
    task_id = enqueue(db, NewTask(client_id="c", model="words", request_json="{}",
                                  run_at=2**62)).task_id
    listed = run("tasks", "list", "--json")
    assert [t["run_at"] for t in listed if t["id"] == task_id] == ["9999-12-31T23:59:59.999Z"]


def test_pair_and_clients_set_give_a_client_its_limits(run: Any) -> None:
    issued = run("pair", "--token", "--max-active-tasks", "4", "--max-streams", "2", "--json")
    [shown] = [c for c in run("clients", "list", "--json") if c["id"] == issued["client_id"]]
    assert (shown["max_active_tasks"], shown["max_streams"]) == (4, 2)
    changed = run("clients", "set", issued["client_id"], "--requests-per-second", "3",
                  "--default", "max_streams", "--json")
    assert (changed["max_active_tasks"], changed["requests_per_second"],
            changed["max_streams"]) == (4, 3.0, None)


def test_tasks_list_filters_by_priority(run: Any, db: Database, settings: Settings) -> None:
    model = register_test_model(db, settings.models_dir)
    urgent = enqueue(db, NewTask(client_id="c", model=model, request_json="{}",
                                 priority=0)).task_id
    enqueue(db, NewTask(client_id="c", model=model, request_json="{}"))
    assert [t["id"] for t in run("tasks", "list", "--priority", "0", "--json")] == [urgent]

def test_every_command_is_found_in_its_own_module() -> None:
    import importlib

    from infra.cli import COMMAND_MODULES

    listed = {}
    for module_name in set(COMMAND_MODULES.values()):
        for command in importlib.import_module(f"infra.cli.{module_name}").COMMANDS:
            listed[command.name] = module_name
    assert listed == COMMAND_MODULES


def _loaded_after(imports: str, names: tuple[str, ...]) -> list[str]:
    """Which of `names` a fresh interpreter holds once it has run `imports`."""
    import subprocess
    import sys

    probe = f"import sys; {imports}; print(sorted(m for m in {names!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True)
    return list(ast.literal_eval(done.stdout.strip()))


def test_the_sweeper_command_loads_no_http_server() -> None:
    # Nor what only other commands or processes use: alembic migrates, pydantic-settings
    # is not used at all (`core.settings` reads its sources itself, and converts them
    # with msgspec; pydantic is for the request models the API validates). Nor what
    # comes after the first claim: croniter (and its dateutil, and its `file` subprocess)
    # walks the maintenance schedule, tomllib reads a `taskward.toml` only where there
    # is one, and what an attempt runs with (the stored request's decoder, completion)
    # is imported once a claim has taken work (`Workers.claim`). No store's dialect
    # either: the engine, made later, imports its own (`core.tables` names both).
    unused = ("granian", "litestar", "handlers", "alembic", "pydantic", "pydantic_settings",
              "httpx", "croniter", "dateutil", "tomllib", "scheduler.execute", "core.requests",
              "core.store.completion", "sqlalchemy.dialects.sqlite",
              "sqlalchemy.dialects.postgresql")
    assert _loaded_after("from infra.cli import main; main.get_command(None, 'sweeper'); "
                         "import scheduler.loop", unused) == []


def test_an_attempt_loads_no_request_models() -> None:
    # A claimed no-op attempt reads its stored body with `core.stored_request`: the
    # request models and pydantic are the API's (and schedule firing's), not a drain's.
    assert _loaded_after("from scheduler.workers import _import_attempt_modules; "
                         "_import_attempt_modules()", ("pydantic", "core.requests")) == []


def test_the_maintenance_modules_load_no_store_dialect() -> None:
    # A sweeper's start-of-life maintenance pass fires schedules (births, schedule slots)
    # beside its first attempts: on SQLite it must not pay for PostgreSQL's dialect.
    assert _loaded_after("import core.schedule_firing, core.store.births, "
                         "core.store.schedule_slots, core.store.pg_births",
                         ("sqlalchemy.dialects.postgresql",)) == []


def test_command_modules_are_imported_with_the_collector_paused() -> None:
    import gc

    from infra.cli import collector_paused

    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # left as the caller had it
    finally:
        gc.enable()


def test_a_frozen_start_up_is_left_out_of_later_collections() -> None:
    import gc

    from infra.cli import collector_paused

    gc.unfreeze()
    try:
        with collector_paused(freeze=True):
            made = [object() for _ in range(3)] + [[]]  # a tracked container among them
            assert not gc.isenabled()
        assert gc.isenabled()
        assert gc.get_freeze_count() > 0
        assert not any(o is made[-1] for generation in range(3)
                       for o in gc.get_objects(generation))
    finally:
        gc.unfreeze()


@pytest.mark.parametrize("command", [
    ["tasks", "list"], ["pair", "--token"], ["migrate"], ["recover"], ["sweep"], ["sweeper"],
    ["serve", "--port", "0"], ["run", "--port", "0"]])
def test_a_store_nobody_answers_at_ends_a_command_with_one_line_saying_what_to_check(
        command: list[str], tmp_path: Path) -> None:
    """Real processes, against a loopback port nothing listens on. It was the driver's
    traceback, 125-137 lines of it, whatever the command."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKWARD_")}
    nobody = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/x"
    env.update({"TASKWARD_DATABASE_URL": nobody, "TASKWARD_MODELS_DIR": str(tmp_path)})
    done = subprocess.run([TASKWARD, *command], env=env, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert line.startswith("Error: the store is unavailable (OperationalError: connection "
                           "failed: "), line
    assert line.endswith("; check TASKWARD_DATABASE_URL and that the database server is up "
                         "and takes writes, then run the command again")
