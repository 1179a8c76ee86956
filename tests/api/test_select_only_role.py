"""A PostgreSQL role granted SELECT alone on taskward's tables: `/readyz` says the
process is not ready (it answered 200, was put in rotation and then answered every
write `503`), and `taskward run` ends at start-up with the line that says what to
grant, as every other command does (it printed the generic "store unavailable")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
from click.testing import CliRunner
from litestar.testing import TestClient
from sqlalchemy.engine import make_url

from core.settings import Settings
from core.tables import tasks
from infra.app import serving_app
from infra.cli import main
from tests.api.test_store_privileges import GRANT_HINT, role_with
from tests.scheduler.processes import free_port


def test_readyz_is_ready_for_a_role_that_may_write(http: TestClient[Any]) -> None:
    ready = http.get("/readyz")
    assert (ready.status_code, ready.json()) == (200, {"status": "ready"})


def test_readyz_is_not_ready_for_a_select_only_role_and_run_says_what_to_grant(
    tmp_path: Path
) -> None:
    with role_with("SELECT") as (_admin_url, role_url):
        with TestClient(serving_app(Settings(database_url=role_url,
                                             models_dir=tmp_path / "models"))) as client:
            refused = client.get("/readyz")
            assert (refused.status_code, refused.json()["code"],
                    refused.headers.get("retry-after")) == (503, "store_unavailable", "1")
            assert "grant it SELECT, INSERT, UPDATE, DELETE" in refused.json()["detail"]
            assert client.head("/readyz").status_code == 503

        done = CliRunner(env={"TASKWARD_DATABASE_URL": role_url,
                              "TASKWARD_MODELS_DIR": str(tmp_path / "models")}).invoke(
            main, ["run", "--port", str(free_port())])
        assert done.exit_code == 1, done.output
        line = done.stderr.splitlines()[-1]
        assert line.startswith("Error: the store refused this role (InsufficientPrivilege: "
                               "permission denied for table "), line
        assert GRANT_HINT in line, line


def _readyz(role_url: str, tmp_path: Path) -> tuple[int, str]:
    """`/readyz` of a fresh API on `role_url` (new sessions: a role's or a database's
    settings apply to sessions started after them): its status and detail."""
    with TestClient(serving_app(Settings(database_url=role_url,
                                         models_dir=tmp_path / "models"))) as client:
        answer = client.get("/readyz")
        return answer.status_code, answer.json().get("detail", "")


def test_readyz_is_not_ready_where_the_session_takes_no_writes(tmp_path: Path) -> None:
    """`default_transaction_read_only` on the role, the database or in the URL's options
    (as on a hot standby): every write is refused (SQLSTATE 25006), so not ready."""
    with role_with("SELECT, INSERT, UPDATE, DELETE") as (admin_url, role_url):
        role, database = make_url(role_url).username, make_url(role_url).database
        read_only_url = make_url(role_url).update_query_dict(
            {"options": "-c default_transaction_read_only=on"}).render_as_string(False)
        for where, url in ((f"ROLE {role}", role_url), (f'DATABASE "{database}"', role_url),
                           (None, read_only_url)):
            with psycopg.connect(_conninfo(admin_url), autocommit=True) as admin:
                if where is not None:
                    admin.execute(f"ALTER {where} SET default_transaction_read_only = on")
                status, detail = _readyz(url, tmp_path)
                if where is not None:
                    admin.execute(f"ALTER {where} RESET default_transaction_read_only")
            assert (where, status) == (where, 503), detail
            assert "takes no writes in this session (transaction_read_only is on" in detail
            assert "lacks" not in detail, detail
        assert _readyz(role_url, tmp_path) == (200, "")


def test_readyz_asks_for_every_table_written_and_takes_grants_on_all_columns(
    tmp_path: Path
) -> None:
    """Ready takes what every write needs on every table (creating a task writes several,
    retention deletes), granted on the table or on each of its columns."""
    with role_with(None) as (admin_url, role_url):
        role = make_url(role_url).username
        everything = f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}"
        tasks_columns = ", ".join(column.name for column in tasks.columns)
        for grants, status, lacking in (
            ([f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}",
              f"GRANT INSERT, UPDATE ON tasks TO {role}"], 503, "INSERT on clients"),
            ([everything, f"REVOKE DELETE ON responses FROM {role}"], 503, "DELETE on responses"),
            ([everything, f"REVOKE UPDATE ON tasks FROM {role}",
              f"GRANT UPDATE ({tasks_columns}) ON tasks TO {role}"], 200, None),
            ([everything, f"REVOKE UPDATE ON tasks FROM {role}",
              f"GRANT UPDATE (id, status) ON tasks TO {role}"], 503, "UPDATE on tasks"),
        ):
            with psycopg.connect(_conninfo(admin_url), autocommit=True) as admin:
                admin.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {role}")
                admin.execute(f"REVOKE UPDATE ({tasks_columns}) ON tasks FROM {role}")
                for grant in grants:
                    admin.execute(grant)
            answer = _readyz(role_url, tmp_path)
            assert (grants, answer[0]) == (grants, status), answer
            if lacking is not None:
                assert f"(it lacks {lacking}" in answer[1], answer
                assert "grant it SELECT, INSERT, UPDATE, DELETE" in answer[1], answer


def _conninfo(url: str) -> str:
    """psycopg's connection string for a SQLAlchemy URL of the test databases."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
