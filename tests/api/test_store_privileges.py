"""A PostgreSQL role that may read taskward's tables but not write them (or not even
read them): a create is answered `503 store_unavailable`, logged with the cause's
class, as a read-only server's is, and an operator command ends with one line that says
what to grant. It was a `500 internal_error`, and a traceback from the CLI."""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psycopg
from sqlalchemy.engine import make_url

from core.settings import Settings
from core.store.connect import create_db_engine, open_database
from infra.migrate import upgrade
from tests.api.helpers import register_test_model
from tests.api.served import TASKWARD, running_service, service_env
from tests.api.test_served import create
from tests.databases import pg_admin_conninfo, private_pg_database

PROMPT = "a prompt that must not reach an error words=3"
GRANT_HINT = "grant the role of TASKWARD_DATABASE_URL SELECT, INSERT, UPDATE, DELETE"


@contextmanager
def role_with(grant: str | None) -> Iterator[tuple[str, str]]:
    """A migrated private database (its admin URL) and a role of it granted `grant` on
    every table (None: nothing), the role's URL; both dropped afterwards."""
    role = f"taskward_test_role_{secrets.token_hex(4)}"
    with private_pg_database() as url:
        engine = create_db_engine(Settings(database_url=url))
        upgrade(engine)
        engine.dispose()
        database = make_url(url).database
        with psycopg.connect(pg_admin_conninfo(), autocommit=True) as admin:
            admin.execute(f"CREATE ROLE {role} LOGIN")
        try:
            on_database = pg_admin_conninfo().rsplit("/", 1)[0] + f"/{database}"
            with psycopg.connect(on_database, autocommit=True) as admin:
                if grant is not None:
                    admin.execute(f"GRANT {grant} ON ALL TABLES IN SCHEMA public TO {role}")
            yield url, make_url(url).set(username=role).render_as_string(hide_password=False)
        finally:
            with psycopg.connect(pg_admin_conninfo(), autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
                admin.execute(f"DROP ROLE IF EXISTS {role}")


def _taskward(url: str, workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TASKWARD, *args], env=service_env(url, workdir / "models"),
                          cwd=workdir, capture_output=True, text=True, timeout=120)


def test_a_select_only_role_is_answered_503_and_told_what_to_grant(tmp_path: Path) -> None:
    with role_with("SELECT") as (admin_url, role_url):
        store = open_database(Settings(database_url=admin_url))
        register_test_model(store, tmp_path / "models")
        store.dispose()
        issued = _taskward(admin_url, tmp_path, "pair", "--token", "--json")
        token = json.loads(issued.stdout)["token"]
        with running_service(role_url, tmp_path, sweeper=False, workers=1,
                             probe="/healthz") as service:
            with httpx.Client(base_url=service.base_url, timeout=30,
                              headers={"Authorization": f"Bearer {token}"}) as client:
                assert client.get("/readyz").status_code == 503  # never in rotation
                refused = create(client, PROMPT)
                assert (refused.status_code, refused.json()["code"],
                        refused.headers.get("retry-after")) == (503, "store_unavailable", "1")
                assert "must not reach" not in refused.text
        log = (tmp_path / "serve.log").read_text()
        assert "store unavailable (InsufficientPrivilege)" in log, log[-2000:]
        assert "internal_error" not in log and "must not reach" not in log

        paired = _taskward(role_url, tmp_path, "pair", "--token")
        assert paired.returncode == 1
        [line] = paired.stderr.splitlines()
        assert line.startswith("Error: the store refused this role (InsufficientPrivilege: "
                               "permission denied for table "), line
        assert GRANT_HINT in line, line


def test_a_role_without_grants_is_told_what_to_grant_by_every_command(tmp_path: Path) -> None:
    with role_with(None) as (_admin_url, role_url):
        for command in (["recover"], ["sweep"], ["models", "list"]):
            done = _taskward(role_url, tmp_path, *command)
            assert done.returncode == 1, (command, done.stderr[-2000:])
            [line] = done.stderr.splitlines()
            assert "(InsufficientPrivilege: permission denied for table " in line, line
            assert GRANT_HINT in line, line
