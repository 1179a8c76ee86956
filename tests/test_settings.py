"""Settings are strict: unknown keys, bad values and inconsistent pairs stop start-up."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, get_args, get_origin, get_type_hints

import pytest
from msgspec import Meta

from core.settings import (
    _WHOLE_NUMBER_SETTINGS,
    TEN_YEARS_HOURS,
    YEAR_SECONDS,
    Settings,
    SettingsError,
    load_settings,
)
from tests.api.served import TASKWARD


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import os

    for key in list(os.environ):
        if key.upper().startswith("TASKWARD_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)


def test_defaults_follow_the_spec() -> None:
    settings = load_settings()
    assert settings.database_url == "sqlite:///./var/taskward.db"
    assert (settings.lease_seconds, settings.heartbeat_seconds) == (30, 10)
    assert (settings.max_attempts_default, settings.max_attempts_cap) == (3, 10)
    assert settings.worker_concurrency == 2 and settings.max_body_bytes == 1_048_576
    assert settings.sweep_schedule == "* * * * *" and settings.retention_hours == 168


def test_an_unknown_key_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKWARD_LEASE_SECONDZ", "5")
    with pytest.raises(SettingsError, match="TASKWARD_LEASE_SECONDZ"):
        load_settings()


@pytest.mark.parametrize("name", ["taskward_lease_secondz", "Taskward_Lease_Secondz",
                                  "taskward_lease_\u017feconds"])
def test_an_unknown_key_in_any_case_is_named(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    # `taskward_lease_seconds` is read, so its misspelling must not pass unseen; nor may
    # a look-alike that `str.upper` turns into a setting's name (long s, U+017F).
    monkeypatch.setenv(name, "5")
    with pytest.raises(SettingsError, match=f"^unknown setting {name} "):
        load_settings()


def test_one_setting_under_two_spellings_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKWARD_LEASE_SECONDS", "40")
    monkeypatch.setenv("taskward_lease_seconds", "50")
    with pytest.raises(SettingsError, match="^TASKWARD_LEASE_SECONDS is set twice"):
        load_settings()


def test_a_bad_value_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKWARD_WORKER_CONCURRENCY", "many")
    with pytest.raises(SettingsError, match="TASKWARD_WORKER_CONCURRENCY"):
        load_settings()


@pytest.mark.parametrize("written", ["1e1", "2.0", "2e0", " 2"])
def test_a_whole_number_is_written_in_digits(
    monkeypatch: pytest.MonkeyPatch, written: str
) -> None:
    """`1e1` was read as 10 threads and `2.0` as 2, where `2.5` and `+2` were refused."""
    monkeypatch.setenv("TASKWARD_ENGINE_THREADS", written)
    with pytest.raises(SettingsError, match="TASKWARD_ENGINE_THREADS: must be a whole number"):
        load_settings()
    monkeypatch.setenv("TASKWARD_ENGINE_THREADS", "2")
    assert load_settings().engine_threads == 2


def test_the_whole_number_settings_are_those_typed_int() -> None:
    """They are told by their defaults, at no start-up cost: an int-typed setting with
    a float default (or the reverse) would escape the digits-only rule."""
    hints = get_type_hints(Settings, include_extras=True)
    typed_int = {name for name, hint in hints.items()
                 if (get_args(hint)[0] if get_origin(hint) is Annotated else hint) is int}
    assert _WHOLE_NUMBER_SETTINGS == typed_int and "engine_threads" in typed_int


def test_heartbeat_must_be_shorter_than_the_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKWARD_HEARTBEAT_SECONDS", "30")
    with pytest.raises(SettingsError, match="TASKWARD_HEARTBEAT_SECONDS"):
        load_settings()


def test_a_bad_cron_schedule_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKWARD_SWEEP_SCHEDULE", "every minute")
    with pytest.raises(SettingsError, match="TASKWARD_SWEEP_SCHEDULE"):
        load_settings()


@pytest.mark.parametrize("expr", ["0 0 L * *", "*/5 * 30 2 *", "5/10 * * * *"])
def test_the_sweep_schedule_means_what_a_schedule_cron_means(
    monkeypatch: pytest.MonkeyPatch, expr: str
) -> None:
    # croniter accepts all three; `core.cron`, which schedules use, refuses them (an
    # extension, a day that never comes, a Vixie-invalid step), and so do the settings.
    monkeypatch.setenv("TASKWARD_SWEEP_SCHEDULE", expr)
    with pytest.raises(SettingsError, match="TASKWARD_SWEEP_SCHEDULE"):
        load_settings()


def test_toml_file_is_read_and_environment_wins(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "taskward.toml").write_text("lease_seconds = 60\nworker_concurrency = 4\n")
    monkeypatch.setenv("TASKWARD_WORKER_CONCURRENCY", "8")
    settings = load_settings()
    assert (settings.lease_seconds, settings.worker_concurrency) == (60, 8)


def test_an_unknown_key_in_the_toml_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "taskward.toml").write_text("lease_secondz = 60\n")
    with pytest.raises(SettingsError, match="LEASE_SECONDZ"):
        load_settings()


def test_a_relative_models_dir_is_anchored_at_start_up(tmp_path: Path) -> None:
    # Stored model paths are relative to this directory; "./models" must mean one place.
    settings = load_settings()
    assert settings.models_dir == tmp_path / "models"


def test_slow_client_timeouts_default_to_at_most_a_minute() -> None:
    settings = load_settings()
    assert 0 < settings.http_idle_timeout_seconds <= 60
    assert 0 < settings.http_body_timeout_seconds <= 60


def test_a_malformed_toml_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "taskward.toml").write_text("lease_seconds = = 60\n")
    with pytest.raises(SettingsError, match="taskward.toml"):
        load_settings()


def test_keyword_arguments_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # Variable names are case-insensitive, as they were under pydantic-settings.
    monkeypatch.setenv("taskward_lease_seconds", "40")
    monkeypatch.setenv("TASKWARD_NODE_ID", "from-env")
    settings = load_settings(node_id="given")
    assert (settings.lease_seconds, settings.node_id) == (40, "given")


def test_a_value_past_its_bound_is_named_with_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKWARD_WORKER_CONCURRENCY", "0")
    with pytest.raises(SettingsError, match=r"^TASKWARD_WORKER_CONCURRENCY: .*>= 1$"):
        load_settings()


def test_a_file_value_of_the_wrong_type_is_named(tmp_path: Path) -> None:
    (tmp_path / "taskward.toml").write_text("models_dir = 5\n")
    with pytest.raises(SettingsError,
                       match="^taskward.toml: models_dir must be a string, not an integer$"):
        load_settings()


def test_numbers_are_read_from_the_environment_as_their_type(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TASKWARD_LEASE_SECONDS", "2.5")
    monkeypatch.setenv("TASKWARD_HEARTBEAT_SECONDS", "1")
    monkeypatch.setenv("TASKWARD_FLUSH_BYTES", "64")
    settings = load_settings()
    read = (settings.lease_seconds, settings.heartbeat_seconds, settings.flush_bytes)
    assert read == (2.5, 1, 64)
    assert isinstance(settings.flush_bytes, int) and isinstance(settings.lease_seconds, float)


def test_settings_built_directly_are_checked_for_consistency() -> None:
    from dataclasses import replace

    settings = load_settings()
    with pytest.raises(SettingsError, match="TASKWARD_HEARTBEAT_SECONDS"):
        replace(settings, heartbeat_seconds=settings.lease_seconds)


def _numbers() -> dict[str, Meta]:
    """Each numeric setting's bounds, by name."""
    bare, annotated = get_type_hints(Settings), get_type_hints(Settings, include_extras=True)
    return {name: next((m for m in get_args(annotated[name]) if isinstance(m, Meta)), Meta())
            for name, kind in bare.items() if kind in (int, float)}


def test_every_number_has_an_upper_bound() -> None:
    # A lower bound alone let `inf` and `1e300` through, to overflow where they were used.
    assert [name for name, meta in _numbers().items() if meta.le is None] == []


@pytest.mark.parametrize("value", ["inf", "1e300", "nan", "99999999999999999999999"])
@pytest.mark.parametrize("name", sorted(_numbers()))
def test_a_number_past_what_can_be_held_is_named(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(f"TASKWARD_{name.upper()}", value)
    with pytest.raises(SettingsError, match=rf"^TASKWARD_{name.upper()}: "):
        load_settings()


def test_every_number_is_taken_at_its_upper_bound() -> None:
    at_bound: dict[str, object] = {name: meta.le for name, meta in _numbers().items()}
    at_bound["heartbeat_seconds"] = YEAR_SECONDS - 1  # shorter than the lease
    settings = load_settings(**at_bound)
    assert settings.retention_hours == TEN_YEARS_HOURS
    assert settings.lease_seconds == YEAR_SECONDS


@pytest.mark.parametrize(("url", "what"), [
    ("postgresqlfoo", "not a database URL"),
    ("postgresql+psycopg://u:hunter2@h:notaport/db", "its port is not a number"),
    ("postgresql+psycopg://u:hunter2@[::1/x", "its port is not a number"),
    ("postgresql+psycopg://u:hunter2@h:70000/db", "its port is not in 1..65535"),
    ("postgresql+nosuchdriver://x/y", "the PostgreSQL driver nosuchdriver is not psycopg"),
    ("postgresql+psycopg2://u:hunter2@h/db", "the PostgreSQL driver psycopg2 is not psycopg"),
    ("mysql://u:hunter2@h/db", "mysql is neither sqlite nor postgresql"),
    ("sqlite+apsw:///x.db", "the SQLite driver apsw is not pysqlite"),
    ("sqlite://", "it names no database file"),
    ("sqlite:///", "it names no database file"),
    ("sqlite:///:memory:", "it names no database file"),
    ("sqlite:///%00", "it holds a NUL byte"),
    ("sqlite://host/x.db", "a SQLite URL names no host (three slashes before the path)"),
])
def test_a_database_url_of_no_form_taskward_opens_is_named_without_its_password(
    monkeypatch: pytest.MonkeyPatch, url: str, what: str
) -> None:
    monkeypatch.setenv("TASKWARD_DATABASE_URL", url)
    with pytest.raises(SettingsError) as refused:
        load_settings()
    assert str(refused.value) == (f"TASKWARD_DATABASE_URL: {what}; expected sqlite:///PATH "
                                  "or postgresql+psycopg://USER@HOST:PORT/DB")
    assert "hunter2" not in str(refused.value)


@pytest.mark.parametrize("url", [
    "sqlite:///./var/taskward.db", "sqlite:////srv/taskward/taskward.db",
    "sqlite+pysqlite:///x.db", "postgresql+psycopg://u:p@db.internal:5432/taskward",
    "postgresql://u@db/taskward", "postgresql+psycopg:///taskward?host=/run/postgresql"])
def test_a_database_url_of_either_form_is_taken(url: str) -> None:
    assert load_settings(database_url=url).database_url == url


def test_a_models_dir_in_an_unknown_users_home_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TASKWARD_MODELS_DIR", "~nosuchuser-taskward/models")
    with pytest.raises(SettingsError, match="^TASKWARD_MODELS_DIR: ~nosuchuser-taskward "):
        load_settings()


def test_a_toml_file_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    (tmp_path / "taskward.toml").write_bytes(b"\xff\xfe = 1")
    with pytest.raises(SettingsError, match=r"^taskward.toml: not UTF-8 text \(byte 0xff"):
        load_settings()


# A `taskward.toml` in the working directory that is there but is no regular file stops
# start-up with one line naming it (docs/settings.md: one that "cannot be read"): a
# directory (or a FIFO, or a link to nothing) of that name was taken for no file at
# all, and every command went on with the defaults.


def _directory(path: Path) -> None:
    path.mkdir()
    (path / "lease_seconds").write_text("40\n")  # what an operator may have meant


def _fifo(path: Path) -> None:
    os.mkfifo(path)  # opened, it would wait for a writer that never comes


def _dangling_link(path: Path) -> None:
    path.symlink_to(path.with_name("moved.toml"))


@pytest.mark.parametrize(("make", "said"), [
    (_directory, "{path} is not a regular file"),
    (_fifo, "{path} is not a regular file"),
    (_dangling_link, "No such file or directory"),
], ids=["directory", "fifo", "dangling-link"])
def test_a_taskward_toml_that_is_no_regular_file_stops_start_up(
        make: Callable[[Path], None], said: str, tmp_path: Path) -> None:
    path = tmp_path / "taskward.toml"
    make(path)
    with pytest.raises(SettingsError) as refused:
        load_settings()
    assert str(refused.value) == "taskward.toml: cannot read it: " + said.format(path=path)


def test_a_command_started_beside_a_taskward_toml_directory_exits_1_naming_it(
        tmp_path: Path) -> None:
    _directory(tmp_path / "taskward.toml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKWARD_")}
    done = subprocess.run([TASKWARD, "tasks", "list"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr.splitlines()) == (1, [
        f"Error: configuration error: taskward.toml: cannot read it: {tmp_path}/taskward.toml "
        "is not a regular file"])
    assert list(tmp_path.iterdir()) == [tmp_path / "taskward.toml"]  # no store was made either
