"""Values that passed their rule and then did not work: a store wait too short for a
PostgreSQL connection to be made (every POST and /readyz answered 503 at 0.01 s), a
node id with a newline (it forges log lines), and a number with a trailing space,
which was refused as "Expected `float`, got `str`"."""

from __future__ import annotations

import pytest

from core.settings import SettingsError, load_settings
from tests.test_settings import clean_environment  # noqa: F401  autouse: no TASKWARD_*, cwd tmp

MALFORMED = ("must be a number, written in digits with an optional fraction and exponent "
             "(`30`, `2.5`, `1e3`), without spaces")


@pytest.mark.parametrize("value", ["0.01", "0.05", "0.999"])
def test_a_store_wait_under_a_second_is_refused(
        monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("TASKWARD_STORE_WAIT_SECONDS", value)
    with pytest.raises(SettingsError) as refused:
        load_settings()
    assert str(refused.value) == "TASKWARD_STORE_WAIT_SECONDS: Expected `float` >= 1.0"


def test_a_store_wait_of_a_second_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKWARD_STORE_WAIT_SECONDS", "1")
    assert load_settings().store_wait_seconds == 1


@pytest.mark.parametrize(("value", "code"), [
    ("sweeper-1\nINFO forged", "U+000A"), ("a\rb", "U+000D"), ("a\x1b[31mb", "U+001B"),
    ("a\x7fb", "U+007F"), ("a\x85b", "U+0085"), ("a\u202eb", "U+202E"), ("a\u2028b", "U+2028"),
])
def test_a_node_id_with_an_unprintable_character_is_refused_naming_it(
        monkeypatch: pytest.MonkeyPatch, value: str, code: str) -> None:
    monkeypatch.setenv("TASKWARD_NODE_ID", value)
    with pytest.raises(SettingsError) as refused:
        load_settings()
    assert str(refused.value) == (f"TASKWARD_NODE_ID: holds {code}, a control or other "
                                  "unprintable character; it is written to logs and the store")


def test_a_node_id_of_printable_characters_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKWARD_NODE_ID", "rack 3/sweeper-é")
    assert load_settings().node_id == "rack 3/sweeper-é"


@pytest.mark.parametrize("value", ["30 ", " 30", "30s", ".5", "", "1_000"])
def test_a_malformed_number_is_named_with_how_to_write_one(
        monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("TASKWARD_LEASE_SECONDS", value)
    with pytest.raises(SettingsError) as refused:
        load_settings()
    assert str(refused.value) == f"TASKWARD_LEASE_SECONDS: {MALFORMED}"
