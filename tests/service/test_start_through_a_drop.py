"""`taskward run`'s start-up steps (migrate, recover, seed) each made once more on a
fresh connection when the store drops the one under it, as a pooler's restart during
a deploy does: one start in three ended `the store is unavailable` while a red team's
loop ended the database's sessions once a second. The drop here is the server's own
(`pg_terminate_backend` of the step's session), at a known point."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text

from core.settings import Settings
from core.store.database import Database
from infra import runtime


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_connection_dropped_under_a_start_up_step_costs_a_line_not_the_start(
    settings: Settings, model_id: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    drops: list[int] = []
    real_recover = runtime.recover  # type: ignore[attr-defined]  # the name the step calls

    def recover_after_its_session_ends(db: Database, **scope: Any) -> dict[str, int]:
        if not drops:
            with db.read() as conn:
                drops.append(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
                conn.execute(text("SELECT pg_terminate_backend(pg_backend_pid())"))
        return real_recover(db, **scope)

    monkeypatch.setattr(runtime, "recover", recover_after_its_session_ends)
    prepared = runtime.prepare(settings)
    assert len(drops) == 1
    assert prepared.recovered is not None
    assert "recovery: the store dropped the connection" in caplog.text


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_second_drop_still_ends_the_start(
    settings: Settings, model_id: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    def recover_whose_session_always_ends(db: Database, **_scope: Any) -> dict[str, int]:
        with db.read() as conn:
            conn.execute(text("SELECT pg_terminate_backend(pg_backend_pid())"))
        raise AssertionError("the session was ended under this statement")

    monkeypatch.setattr(runtime, "recover", recover_whose_session_always_ends)
    with pytest.raises(Exception, match="terminating connection"):
        runtime.prepare(settings)
