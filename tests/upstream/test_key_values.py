"""A key variable holding a value no header can carry fails its task at once, as a
missing one does: nothing is sent, the URL is not cooled down, and the value is in no
message or log. What is sent is observed on a loopback listener standing for an
upstream a user runs outside this process (tests/upstream/test_key_envs.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from core.engines.upstream.routing import ROUTER
from core.settings import Settings
from core.states import Status
from core.store.database import Database
from tests.store.helpers import task_row
from tests.upstream.helpers import add_upstream, enqueue
from tests.upstream.test_errors import run_until_finished
from tests.upstream.test_key_envs import Listener, listener  # noqa: F401  (its fixture)

SECRET = "SECRETVALUE"


@pytest.mark.parametrize("key", [f"sk-{SECRET}\r\nX-Injected: yes", f"sk-{SECRET}\n",
                                 f" sk-{SECRET}", f"sk-{SECRET} ", f"sk-{SECRET}\u00e9",
                                 f"sk-{SECRET}\x7f"],
                         ids=["CRLF", "LF", "leading space", "trailing space", "non-ASCII",
                              "DEL"])
def test_a_key_no_header_can_carry_fails_at_once_and_sends_nothing(
    db: Database, quick: Settings, listener: Listener,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, key: str,
) -> None:
    """It failed as a broken connection (the shared URL cooled down) or a broken stream,
    retried until dead-lettered."""
    monkeypatch.setenv("UPSTREAM_TEST_ODD_KEY", key)
    add_upstream(db, [listener.base_url], api_key_env="UPSTREAM_TEST_ODD_KEY")
    [task_id] = enqueue(db, max_attempts=3, max_output_tokens=4)

    run_until_finished(db, replace(quick, upstream_cooldown_seconds=600), task_id)

    row = task_row(db, task_id)
    assert (row.status, row.error_code, row.attempts) == (Status.FAILED, "upstream_key_missing", 1)
    assert "UPSTREAM_TEST_ODD_KEY" in (row.error_message or "")
    assert SECRET not in (row.error_message or "") and SECRET not in caplog.text
    assert listener.authorizations == []
    assert ROUTER.cooldown_left_seconds([listener.base_url]) == 0
