"""A PostgreSQL role granted SELECT alone on taskward's tables: `/readyz` says the
process is not ready (it answered 200, was put in rotation and then answered every
write `503`), and `taskward run` ends at start-up with the line that says what to
grant, as every other command does (it printed the generic "store unavailable")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from click.testing import CliRunner
from litestar.testing import TestClient

from core.settings import Settings
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
