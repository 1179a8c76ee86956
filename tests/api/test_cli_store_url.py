"""What an operator sees when the settings name a store that cannot be used: one line
on standard error, exit status 1, nothing changed. Real `taskward` processes.

Each of these was a traceback (or worse: `sqlite:////dev/null` made /dev/null 0600,
as root, before SQLite found it was no database)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.api.served import TASKWARD

URL_FORMS = "expected sqlite:///PATH or postgresql+psycopg://USER@HOST:PORT/DB"
COMMANDS = [["tasks", "list"], ["pair", "--token"], ["migrate"], ["recover"], ["sweep"],
            ["sweeper"], ["serve", "--port", "0"], ["run", "--port", "0"]]


def taskward(*args: str, cwd: Path, env: dict[str, str] | None = None,
             user: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    """`taskward ARGS` in `cwd` with only `env`'s `TASKWARD_*` settings, as `user`."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TASKWARD_")}
    clean.setdefault("TASKWARD_MODELS_DIR", str(cwd / "models"))
    return subprocess.run([*(user or []), TASKWARD, *args], env={**clean, **(env or {})},
                          capture_output=True, text=True, timeout=60, cwd=cwd)


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    """The single line a refused command prints, after checking it is all it did."""
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    [line] = done.stderr.splitlines()
    assert line.startswith("Error: configuration error: "), line
    return line.removeprefix("Error: configuration error: ")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture
def place() -> Iterator[Path]:
    """A directory every user may enter (pytest's own are root's 0700 ones)."""
    directory = Path(tempfile.mkdtemp(prefix="taskward-url-"))
    directory.chmod(0o755)
    yield directory
    shutil.rmtree(directory)


@pytest.fixture
def nobody() -> list[str]:
    """A prefix that runs a command as a user who owns nothing here."""
    if os.geteuid() != 0:
        return []  # already such a user for the root-less directories below
    # util-linux's setpriv is on every Debian machine; without it this cannot be tested,
    # which is a failure, not a pass.
    if shutil.which("setpriv") is None:
        pytest.fail("setpriv (util-linux) is needed to run a command as another user")
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


# --- 1. a path that is not a store -----------------------------------------------------

def _model_file(place: Path) -> Path:
    path = place / "models" / "good.gguf"
    path.parent.mkdir()
    path.write_bytes(b"GGUF" + bytes(60))
    return path


def _fifo(place: Path) -> Path:
    os.mkfifo(place / "fifo")
    return place / "fifo"


def _directory(place: Path) -> Path:
    (place / "dir").mkdir()
    return place / "dir"


def _character_device(place: Path) -> Path:
    """A node of /dev/null's kind (its own inode: a chmod of it leaves /dev/null alone)."""
    try:
        os.mknod(place / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:  # the suite runs as root here, as in CI (the tmpfs tests too)
        pytest.fail("making a device node needs root (CAP_MKNOD): run the suite as root")
    return place / "null"


@pytest.mark.parametrize(("make", "kind"), [
    (_model_file, "a file that is not a SQLite database"), (_fifo, "a FIFO"),
    (_directory, "a directory"), (_character_device, "a character device")])
def test_a_path_that_is_not_a_store_is_refused_and_left_as_it_was(
        make: Callable[[Path], Path], kind: str, place: Path) -> None:
    target = make(place)
    target.chmod(0o755 if target.is_dir() else 0o644)
    before = target.lstat()
    line = one_line_error(taskward("tasks", "list", cwd=place,
                                   env={"TASKWARD_DATABASE_URL": f"sqlite:///{target}"}))
    assert line == (f"TASKWARD_DATABASE_URL names {target}, {kind}, not a taskward store; "
                    "nothing was changed")
    after = target.lstat()
    assert (after.st_mode, after.st_size, after.st_mtime_ns) == (
        before.st_mode, before.st_size, before.st_mtime_ns)
    assert not Path(f"{target}-wal").exists() and not Path(f"{target}-shm").exists()


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_refuses_a_model_file_named_as_the_store(
        command: list[str], place: Path) -> None:
    model = _model_file(place)
    model.chmod(0o644)
    line = one_line_error(taskward(*command, cwd=place,
                                   env={"TASKWARD_DATABASE_URL": f"sqlite:///{model}"}))
    assert line.endswith("not a taskward store; nothing was changed")
    assert mode(model) == 0o644 and model.read_bytes() == b"GGUF" + bytes(60)


# --- 2. a database URL of no form taskward opens --------------------------------------

@pytest.mark.parametrize(("url", "what"), [
    ("postgresql+nosuchdriver://x/y", "the PostgreSQL driver nosuchdriver is not psycopg"),
    ("postgresql+psycopg2://u@h/db", "the PostgreSQL driver psycopg2 is not psycopg"),
    ("postgresql+psycopg://u:hunter2@h:notaport/db", "its port is not a number"),
    ("postgresql+psycopg://u:hunter2@[::1/x", "its port is not a number"),
    ("postgresqlfoo", "not a database URL"),
    ("mysql://u:hunter2@h/db", "mysql is neither sqlite nor postgresql"),
    ("sqlite:///", "it names no database file"),
    ("sqlite:///:memory:", "it names no database file"),
    ("sqlite:///%00", "it holds a NUL byte"),
])
def test_a_malformed_database_url_is_named_in_one_line(url: str, what: str,
                                                        place: Path) -> None:
    done = taskward("tasks", "list", cwd=place, env={"TASKWARD_DATABASE_URL": url})
    assert one_line_error(done) == f"TASKWARD_DATABASE_URL: {what}; {URL_FORMS}"
    assert "hunter2" not in done.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_names_a_bad_database_url_without_its_password(
        command: list[str], place: Path) -> None:
    done = taskward(*command, cwd=place, env={
        "TASKWARD_DATABASE_URL": "postgresql+psycopg://admin:hunter2@db:port/taskward"})
    assert one_line_error(done) == f"TASKWARD_DATABASE_URL: its port is not a number; {URL_FORMS}"
    assert "hunter2" not in done.stderr


def test_a_file_name_too_long_is_named_in_one_line(place: Path) -> None:
    database = place / ("x" * 300 + ".db")
    line = one_line_error(taskward("migrate", cwd=place,
                                   env={"TASKWARD_DATABASE_URL": f"sqlite:///{database}"}))
    assert line == (f"cannot create the store {database}: File name too long; set "
                    "TASKWARD_DATABASE_URL to a path this user can use")


# --- 3. a data directory this user may not write --------------------------------------

# The commands that create a store; the others name it missing (test_cli_missing_store).
@pytest.mark.parametrize("command", [["migrate"], ["run", "--port", "0"]])
@pytest.mark.parametrize("name", ["taskward.db", "var/taskward.db"])
def test_a_store_this_user_cannot_create_is_named_with_what_to_do(
        command: list[str], name: str, place: Path, nobody: list[str]) -> None:
    place.chmod(0o555)  # root's 0755 for the user nobody; nobody's own 0555 otherwise
    database = place / name
    line = one_line_error(taskward(*command, cwd=place, user=nobody,
                                   env={"TASKWARD_DATABASE_URL": f"sqlite:///{database}"}))
    assert line == (f"cannot create the store {database}: Permission denied; make its "
                    "directory writable by this user or set TASKWARD_DATABASE_URL")
    assert list(place.iterdir()) == []


# --- 4. a taskward.toml that cannot be read -------------------------------------------

def test_a_taskward_toml_that_is_not_utf8_is_named(place: Path) -> None:
    (place / "taskward.toml").write_bytes(b"\xff\xfe = 1")
    line = one_line_error(taskward("tasks", "list", cwd=place))
    assert line == "taskward.toml: not UTF-8 text (byte 0xff at offset 0)"


def test_a_taskward_toml_this_user_cannot_read_is_named(place: Path,
                                                        nobody: list[str]) -> None:
    (place / "taskward.toml").write_text("lease_seconds = 40\n")
    (place / "taskward.toml").chmod(0)
    line = one_line_error(taskward("tasks", "list", cwd=place, user=nobody))
    assert line == "taskward.toml: cannot read it: Permission denied"


# --- 5. a number past what the code and the store hold --------------------------------

@pytest.mark.parametrize(("command", "name", "value"), [
    (["pair"], "TASKWARD_PAIRING_CODE_TTL_SECONDS", "inf"),
    (["pair"], "TASKWARD_PAIRING_CODE_TTL_SECONDS", "1e300"),
    (["sweep"], "TASKWARD_RETENTION_HOURS", "inf"),
    (["sweep"], "TASKWARD_RETENTION_HOURS", "1e300"),
    (["sweep"], "TASKWARD_LEASE_SECONDS", "inf"),
])
def test_a_number_too_large_to_hold_stops_the_command_naming_its_key(
        command: list[str], name: str, value: str, place: Path) -> None:
    env = {"TASKWARD_DATABASE_URL": f"sqlite:///{place / 'taskward.db'}"}
    assert taskward("migrate", cwd=place, env=env).returncode == 0
    line = one_line_error(taskward(*command, cwd=place, env={**env, name: value}))
    assert line.startswith(f"{name}: Expected `float` <= "), line


def test_a_models_dir_of_an_unknown_users_home_is_named(place: Path) -> None:
    done = taskward("models", "list", cwd=place,
                    env={"TASKWARD_MODELS_DIR": "~nosuchuser-taskward/models"})
    assert one_line_error(done) == (
        "TASKWARD_MODELS_DIR: ~nosuchuser-taskward is no user's home directory here")
