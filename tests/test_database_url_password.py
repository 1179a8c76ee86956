"""A PostgreSQL URL whose password holds an unencoded `@` is refused at start-up without
quoting any part of the password; percent-encoded, the same password is taken."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import make_url

from core.settings import SettingsError, load_settings

_UNENCODED = "postgresql+psycopg://u:hunter2@TOPSECRET@127.0.0.1:5432/db"
_ENCODED = "postgresql+psycopg://u:hunter2%40TOPSECRET@127.0.0.1:5432/db"


def test_an_unencoded_at_in_the_password_is_refused_without_quoting_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TASKWARD_DATABASE_URL", _UNENCODED)
    with pytest.raises(SettingsError) as refused:
        load_settings()
    said = str(refused.value)
    assert "hunter2" not in said and "TOPSECRET" not in said
    assert "%40" in said and "percent-encoded" in said


def test_a_percent_encoded_at_in_the_password_is_taken() -> None:
    settings = load_settings(database_url=_ENCODED)
    parsed = make_url(settings.database_url)
    assert parsed.password == "hunter2@TOPSECRET"
    assert parsed.host == "127.0.0.1"
