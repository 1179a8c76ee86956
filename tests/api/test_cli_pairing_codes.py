"""`taskward pairing-codes list|revoke` (docs/cli.md), run in-process on both stores."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner, Result

from core.errors import Unauthorized
from core.settings import Settings
from core.store.clients import create_pairing_code, redeem_pairing_code
from core.store.database import Database
from infra.cli import main


@pytest.fixture
def taskward(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("TASKWARD_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("TASKWARD_MODELS_DIR", str(settings.models_dir))
    return lambda *args: CliRunner().invoke(main, list(args))


def test_pairing_codes_list_shows_outstanding_codes_and_revoke_ends_one(
    db: Database, taskward: Any
) -> None:
    made = json.loads(taskward("pair", "--scopes", "tasks:read", "--name", "ci",
                               "--json").output)
    code_id = made["code"].split("-", 1)[0]

    listed = taskward("pairing-codes", "list", "--json")

    assert listed.exit_code == 0
    [item] = json.loads(listed.output)
    assert (item["id"], item["object"], item["name"], item["scopes"], item["created_by"]) == (
        code_id, "pairing_code", "ci", ["tasks:read"], None)
    assert made["code"].split("-", 1)[1] not in listed.output
    table = taskward("pairing-codes", "list").output
    assert table.split()[:6] == ["ID", "NAME", "SCOPES", "CREATED_AT", "EXPIRES_AT",
                                 "CREATED_BY"]
    assert code_id in table

    revoked = taskward("pairing-codes", "revoke", code_id)

    assert (revoked.exit_code, revoked.output) == (0, f"revoked {code_id}\n")
    with pytest.raises(Unauthorized):
        redeem_pairing_code(db, made["code"])
    assert json.loads(taskward("pairing-codes", "list", "--json").output) == []
    assert taskward("pairing-codes", "list").output == "(none)\n"


def test_revoking_a_code_that_is_not_outstanding_ends_with_one_line(
    db: Database, taskward: Any
) -> None:
    used = create_pairing_code(db, scopes=frozenset({"tasks:read"}), ttl_seconds=60).code
    redeem_pairing_code(db, used)
    for code_id in (used.split("-", 1)[0], "pc_aaaaaaaaaaaaaaaaaaaa", "not-an-id"):
        refused: Result = taskward("pairing-codes", "revoke", code_id)
        assert refused.exit_code == 1
        assert refused.output.startswith("Error: pairing_code_not_found: ")
        assert len(refused.output.splitlines()) == 1
    # Like `clients revoke`, it prints one line and takes no `--json`.
    assert taskward("pairing-codes", "revoke", "--json", "pc_x").exit_code == 2
