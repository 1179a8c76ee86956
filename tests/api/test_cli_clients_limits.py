"""`taskward clients list` shows each client's limits (docs/cli.md): one column per
limit of `core.quotas`, `-` where the setting's default applies, on both stores. The
table showed none of them; `--json` had them all along and keeps its keys."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from core.quotas import LIMIT_NAMES
from core.settings import Settings
from infra.cli import main


def _run(*args: str) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_the_clients_table_shows_every_limit(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKWARD_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("TASKWARD_MODELS_DIR", str(settings.models_dir))
    _run("pair", "--token", "--name", "capped", "--max-active-tasks", "3",
         "--requests-per-second", "2.5")
    header, row = _run("clients", "list").splitlines()
    assert header.split() == ["ID", "NAME", "SCOPES", "CREATED_AT", "REVOKED_AT",
                              *(name.upper() for name in LIMIT_NAMES)]
    assert row.split()[-3:] == ["3", "2.5", "-"]  # max_streams: the setting's default
    [shown] = json.loads(_run("clients", "list", "--json"))
    assert set(shown) == {"id", "object", "name", "scopes", "created_at", "revoked_at",
                          "max_active_tasks", "requests_per_second", "max_streams"}
    assert [shown[name] for name in LIMIT_NAMES] == [3, 2.5, None]
