"""One typed settings object, read once at start-up and passed down.

Sources, strongest first: `TASKWARD_*` environment variables (names in any case),
then an optional `taskward.toml` in the working directory (keys without the prefix,
lower case: the file has one spelling). Parsing is strict: an unknown key, a bad value
or an inconsistent pair stops start-up with a message that names the key as its source
spells it (`TASKWARD_LEASE_SECONDS: …`, `taskward.toml: lease_seconds: …`). Each source
is held to its own form as strictly: a whole-number setting is digits in the
environment, a TOML integer in the file.

`Settings` is a frozen dataclass whose bounds are msgspec's (`Meta` in each field's
annotation), and `load_settings` reads the two sources and converts them with
msgspec (strings to numbers as the environment needs). It was a pydantic model (and,
before that, pydantic-settings): every process imports the settings first, and
pydantic's import with that model's schema was ~28 % of the instructions a sweeper
executes before its first claim, which needs nothing else of pydantic
(docs/benchmarks.md, "Settings without pydantic", issue 15).
"""

from __future__ import annotations

import os
import re
import socket
import stat
from collections.abc import Callable
from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from core.cron import parse_cron
from core.engines.base import usable_cores
from core.errors import InvalidInput

ENV_PREFIX = "TASKWARD_"
TOML_FILE = "taskward.toml"

# Every number has an upper bound as well as a lower one: a value read as `inf` or
# `1e300` passed a lower bound alone, then overflowed where it was used (an `int()` of
# it, a store's 64-bit time column, a C `int`). Durations stop at a year (`_hours`:
# ten years), far inside what milliseconds since the epoch plus a duration can hold.
YEAR_SECONDS = 31_536_000
TEN_YEARS_HOURS = 87_600
Seconds = Annotated[float, Meta(gt=0, le=YEAR_SECONDS)]
SecondsOrZero = Annotated[float, Meta(ge=0, le=YEAR_SECONDS)]
Hours = Annotated[float, Meta(gt=0, le=TEN_YEARS_HOURS)]
# The largest value of each of a client's limits (`core.quotas`), wherever one is set:
# the API, the CLI and these defaults. What the store's INTEGER columns hold, and a
# rate that is still a rate.
MAX_ACTIVE_TASKS_BOUND = 10**9
REQUESTS_PER_SECOND_BOUND = 10**6
MAX_STREAMS_BOUND = 10**6
ClientTasks = Annotated[int, Meta(ge=0, le=MAX_ACTIVE_TASKS_BOUND)]
ClientRate = Annotated[float, Meta(ge=0, le=REQUESTS_PER_SECOND_BOUND)]
ClientStreams = Annotated[int, Meta(ge=1, le=MAX_STREAMS_BOUND)]
# Per API process: forty clients' worth of `client_max_streams` streams, with room left.
DEFAULT_HTTP_MAX_CONNECTIONS = 4096

DATABASE_URL_FORMS = "sqlite:///PATH or postgresql+psycopg://USER@HOST:PORT/DB"


class SettingsError(Exception):
    """Start-up configuration is unusable; the message names the key."""


class SettingRefused(SettingsError):
    """A check no single bound states refused `name`'s value (`reason`: `: what is
    wrong`), or its pair with `other`'s (`reason`: ` must be shorter than`). Its message
    names each setting by its variable, all a `Settings` built directly knows of it;
    `load_settings`, which knows each value's source, names one its file gave by the
    file and key instead (`told`)."""

    def __init__(self, name: str, reason: str, other: str | None = None) -> None:
        self.name, self.reason, self.other = name, reason, other
        super().__init__(self.told(from_file=frozenset(), given=frozenset()))

    def told(self, *, from_file: frozenset[str], given: frozenset[str]) -> str:
        """The message, with the settings whose values in force came from the file
        (`from_file`) named as its keys. `given` were set elsewhere (the environment, a
        keyword); a setting in neither holds its default, and is spelled as the file
        spells it beside one from the file (`taskward.toml: heartbeat_seconds must be
        shorter than lease_seconds`), as a variable otherwise."""
        names = (self.name,) if self.other is None else (self.name, self.other)
        if from_file.isdisjoint(names):
            prefix, spelled = "", [_variable(name) for name in names]
        elif given.isdisjoint(names):
            prefix, spelled = f"{TOML_FILE}: ", list(names)
        else:  # one from the file, the other from the environment
            prefix = f"{TOML_FILE}: " if self.name in from_file else ""
            spelled = [self.name if self.name in from_file else _variable(self.name)] + [
                f"{name} of {TOML_FILE}" if name in from_file else _variable(name)
                for name in names[1:]]
        return prefix + spelled[0] + self.reason + "".join(f" {name}" for name in spelled[1:])


def _variable(name: str) -> str:
    return ENV_PREFIX + name.upper()


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Every setting. Built directly, it holds what it is given (typed by the caller,
    checked for consistency); `load_settings` is how a process reads its sources."""

    database_url: str = "sqlite:///./var/taskward.db"
    models_dir: Path = Path("./models")
    # Printable only (`__post_init__`): it is written to logs, one line per record.
    node_id: Annotated[str, Meta(min_length=1, max_length=200)] = field(
        default_factory=socket.gethostname)
    lease_seconds: Seconds = 30.0
    heartbeat_seconds: Seconds = 10.0
    # The engine batches a model's attempts: raise it to 8 for throughput (docs/operations.md).
    worker_concurrency: Annotated[int, Meta(ge=1, le=256)] = 2
    sweep_schedule: str = "* * * * *"
    task_timeout_seconds: Seconds = 600.0
    max_attempts_default: Annotated[int, Meta(ge=1, le=1000)] = 3
    max_attempts_cap: Annotated[int, Meta(ge=1, le=1000)] = 10
    retention_hours: Hours = 168.0
    idempotency_ttl_hours: Hours = 24.0
    max_body_bytes: Annotated[int, Meta(ge=1024, le=1 << 30)] = 1_048_576
    # Knobs a production operator expects to have (docs/settings.md lists them all).
    sqlite_synchronous: Literal["FULL", "NORMAL"] = "FULL"
    # At most an hour, as TASKWARD_STORE_WAIT_SECONDS (SQLite holds it in a C `int`).
    sqlite_busy_timeout_ms: Annotated[int, Meta(ge=0, le=3_600_000)] = 10_000
    # One decode loop per loaded model computes with this many threads, whatever the
    # concurrency; more threads than usable cores only spin (docs/operations.md).
    engine_threads: Annotated[int, Meta(ge=1, le=256)] = field(default_factory=usable_cores)
    engine_context_tokens: Annotated[int, Meta(ge=256, le=1_048_576)] = 8192
    # Opt-in: every taskward process on a host takes turns on this file around each
    # compute step. Off by default: with the engine's short OpenMP spin, two processes without
    # it did better in every measured run (docs/benchmarks.md, "Two processes").
    engine_host_lock: str = ""
    model_cache_size: Annotated[int, Meta(ge=1, le=32)] = 2
    sync_timeout_seconds: Annotated[float, Meta(gt=0, le=600)] = 60.0
    pairing_code_ttl_seconds: Seconds = 600.0
    retention_batch_size: Annotated[int, Meta(ge=1, le=100_000)] = 2000
    flush_interval_ms: Annotated[int, Meta(ge=1, le=10_000)] = 100
    flush_bytes: Annotated[int, Meta(ge=1, le=1 << 24)] = 512
    drain_seconds: SecondsOrZero = 20.0
    backoff_base_seconds: Seconds = 2.0
    backoff_max_seconds: Seconds = 300.0
    poll_interval_ms: Annotated[int, Meta(ge=5, le=10_000)] = 50
    # Slow clients (docs/operations.md): a connection that sends no complete request
    # head for this long is closed (a fresh idle one, a keep-alive one, trickled
    # headers), and a request body that stalls this long between pieces gets a 408.
    # 0 turns one off (only for measuring what it costs: bench/http.py).
    http_idle_timeout_seconds: Annotated[float, Meta(ge=0, le=3600)] = 30.0
    http_body_timeout_seconds: Annotated[float, Meta(ge=0, le=3600)] = 30.0
    # Connections one API process holds open at once (granian's backpressure); more wait
    # in the listen queue. Each open stream or wait is one (docs/operations.md).
    http_max_connections: Annotated[int, Meta(ge=128, le=1_000_000)] = (
        DEFAULT_HTTP_MAX_CONNECTIONS)
    # How long a request waits for one store call before its 503 (handlers/threads.py):
    # a store that stops answering must not hold every request for minutes. At least a
    # second: it also bounds a PostgreSQL session's idle time inside a transaction, and
    # below that a fresh connection or a busy host's pause was taken for an outage
    # (measured on the 2-core test host, busy: at 0.2 s one run answered 3 of 5 POSTs
    # 503; at 0.05 s the first request was 503 at times; at 0.01 s `serve` did not
    # start, its idle-in-transaction bound of 10 ms ending its start-up's session).
    # libpq's own timeouts are whole seconds, at least 2: no tighter below a second.
    store_wait_seconds: Annotated[float, Meta(ge=1, le=3600)] = 30.0
    console_session_hours: Annotated[float, Meta(gt=0, le=720)] = 8.0  # an operator console login
    # Per-client defaults (`core.quotas`): a client's own value, when set, wins.
    client_max_active_tasks: ClientTasks = 0  # 0 = unlimited
    client_requests_per_second: ClientRate = 0.0  # 0 = unlimited
    client_max_streams: ClientStreams = 100
    # Extra engine plug-ins: comma-separated module names imported at start-up, each
    # registering engines with `core.engines.registry.register_engine`.
    engine_modules: str = ""
    # Upstream engines (docs/upstream.md): slots per process for upstream attempts, apart
    # from the local engine's; host patterns an upstream URL must match (comma-separated,
    # `*` wildcards; empty: any host); name patterns an entry's `api_key_env` must match
    # (empty: any name but taskward's and libpq's own); how long a failing base URL is
    # skipped.
    upstream_concurrency: Annotated[int, Meta(ge=1, le=4096)] = 64
    upstream_allowed_hosts: str = ""
    upstream_key_envs: str = ""
    upstream_cooldown_seconds: Annotated[float, Meta(gt=0, le=3600)] = 10.0

    def __post_init__(self) -> None:
        """The checks no single bound states (the database URL's form among them),
        each a `SettingRefused`, and `models_dir` anchored: model paths are stored
        relative to it and joined with it later, so "./models" must mean one place from
        start-up on."""
        given = Path(self.models_dir)
        try:
            models_dir = given.expanduser().absolute()
        except RuntimeError:  # `~name/…` of a user this system does not know
            raise SettingRefused(
                "models_dir", f": {given.parts[0]} is no user's home directory here") from None
        object.__setattr__(self, "models_dir", models_dir)
        check_database_url(self.database_url)
        try:
            parse_cron(self.sweep_schedule)  # the one meaning of a cron expression, as
        except InvalidInput as exc:  # schedules have
            raise SettingRefused("sweep_schedule", f": {exc.message}") from None
        unprintable = next((c for c in self.node_id if not c.isprintable()), None)
        if unprintable is not None:  # a newline in it forged a log line of its own
            raise SettingRefused("node_id", f": holds U+{ord(unprintable):04X}, a control "
                                 "or other unprintable character; it is written to logs "
                                 "and the store")
        if self.heartbeat_seconds >= self.lease_seconds:
            raise SettingRefused("heartbeat_seconds", " must be shorter than", "lease_seconds")
        if self.max_attempts_default > self.max_attempts_cap:
            raise SettingRefused("max_attempts_default", " must not exceed", "max_attempts_cap")
        if self.backoff_base_seconds > self.backoff_max_seconds:
            raise SettingRefused("backoff_base_seconds", " must not exceed",
                                 "backoff_max_seconds")

    @property
    def engine_module_names(self) -> list[str]:
        return [name.strip() for name in self.engine_modules.split(",") if name.strip()]

    @property
    def upstream_host_patterns(self) -> tuple[str, ...]:
        return tuple(p.strip().lower() for p in self.upstream_allowed_hosts.split(",")
                     if p.strip())

    @property
    def upstream_key_env_patterns(self) -> tuple[str, ...]:
        """As written: environment variable names are case-sensitive."""
        return tuple(p.strip() for p in self.upstream_key_envs.split(",") if p.strip())

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")


SETTING_NAMES = frozenset(setting.name for setting in fields(Settings))


def _setting_types() -> dict[str, type]:
    """Each setting's type, told by its default: asking the type hints instead
    evaluated every annotation, 0.56 ms of every process's start-up
    (`tests/test_settings.py` checks that the two agree on the integers)."""
    def default(setting: Field[Any]) -> object:
        if setting.default_factory is not MISSING:
            return setting.default_factory()
        return setting.default
    return {setting.name: type(default(setting)) for setting in fields(Settings)}


_SETTING_TYPES = _setting_types()
# msgspec's lax conversion reads a text `1e1` or `2.0` as the integer it equals, where
# `2.5` and `+2` are refused: a whole-number setting given as text is digits only.
_WHOLE_NUMBER_SETTINGS = frozenset(name for name, kind in _SETTING_TYPES.items() if kind is int)
_FRACTIONAL_SETTINGS = frozenset(name for name, kind in _SETTING_TYPES.items() if kind is float)
# What a `taskward.toml` value of each setting type must be, as TOML names it: the
# file's values are typed, so the file is held to them, as strictly as the environment
# holds its text (msgspec's lax conversion, which the environment needs, took `2.0`
# and `"30"` from the file). A float setting takes an integer too (`lease_seconds = 30`).
_TOML_TYPES: dict[type, tuple[str, tuple[type, ...]]] = {
    int: ("an integer", (int,)),
    float: ("a number", (int, float)),
    str: ("a string", (str,)),
}
_TOML_NAMES = {bool: "a boolean", int: "an integer", float: "a float", str: "a string",
               list: "an array", dict: "a table"}
_DIGITS = re.compile(r"[0-9]+")
_AT_FIELD = re.compile(r"(?P<message>.*) - at `\$\.(?P<name>\w+)`$")


def load_settings(check: Callable[[Settings], None] | None = None, /,
                  **overrides: object) -> Settings:
    """Settings from `TASKWARD_*` variables over `taskward.toml` in the working
    directory, with `overrides` winning over both; or `SettingsError` naming the key as
    the source of its value spells it. `check` (positional: `overrides` are the
    settings' keywords), when given, is the caller's own check of what it alone uses
    (the host lock of a process that decodes): its `SettingRefused` is named so too.

    Variable names are read in any case (`taskward_lease_seconds` sets the lease), and
    held to one rule whatever their case: a name that is no setting stops start-up, and
    so does one setting given under two spellings, whose winner would be the
    environment's order."""
    from_env = _read_environment()
    from_file = _read_file()
    _check_file_keys(from_file)
    _check_file_types(from_file)
    values = {**from_file, **from_env, **overrides}
    for name in sorted(_WHOLE_NUMBER_SETTINGS & values.keys()):
        if isinstance(values[name], str) and not _DIGITS.fullmatch(values[name]):
            raise SettingsError(f"{_variable(name)}: must be a whole number, "
                                "written in digits only")
    given = frozenset(from_env) | frozenset(overrides)
    in_force_from_file = frozenset(from_file) - given
    try:
        settings = msgspec.convert(values, type=Settings, strict=False, dec_hook=decode_path)
        if check is not None:
            check(settings)
        return settings
    except SettingRefused as exc:
        raise SettingsError(exc.told(from_file=in_force_from_file, given=given)) from None
    except msgspec.ValidationError as exc:
        found = _AT_FIELD.match(str(exc))
        if found is None:
            raise SettingsError(f"settings: {exc}") from None
        name, message = found["name"], found["message"]
        if name in _FRACTIONAL_SETTINGS and isinstance(values.get(name), str) and (
                message == "Expected `float`, got `str`"):  # `30 `, `abc`, `.5`: no number
            message = ("must be a number, written in digits with an optional fraction "
                       "and exponent (`30`, `2.5`, `1e3`), without spaces")
        spelled = f"{TOML_FILE}: {name}" if name in in_force_from_file else _variable(name)
        raise SettingsError(f"{spelled}: {message}") from None


def _check_file_keys(from_file: dict[str, Any]) -> None:
    """`SettingsError` for the first key of `taskward.toml` that is no setting, saying
    what to write when it is one spelled as the environment spells it: the file's keys
    have one spelling, lower case without the prefix (`LEASE_SECONDS` and
    `taskward_lease_seconds` were reported as settings that do not exist)."""
    for key in sorted(from_file):
        if key in SETTING_NAMES:
            continue
        meant = key.lower().removeprefix(ENV_PREFIX.lower())
        if not key.isascii() or meant not in SETTING_NAMES:
            raise SettingsError(f"{TOML_FILE}: unknown setting {key} "
                                f"({_variable(key)} is not one)")
        broken = [rule for rule, kept in (("are lower case", key == key.lower()),
                                          (f"have no {ENV_PREFIX} prefix", meant == key.lower()))
                  if not kept]
        raise SettingsError(f"{TOML_FILE}: {key}: its keys {' and '.join(broken)}; "
                            f"write {meant}")


def _check_file_types(from_file: dict[str, Any]) -> None:
    """`SettingsError` naming the file, the key and the TOML type it takes, for the
    first value of `taskward.toml` not of its setting's type (`_TOML_TYPES`). A path
    is a string. The value is not quoted: the file may hold a database password."""
    for name in sorted(from_file):
        kind = _SETTING_TYPES[name]
        expected, takes = _TOML_TYPES[str if issubclass(kind, Path) else kind]
        value = from_file[name]
        if type(value) not in takes:  # `type`: TOML's `true` is no integer
            found = _TOML_NAMES.get(type(value), "a date or time")
            raise SettingsError(f"{TOML_FILE}: {name} must be {expected}, not {found}")


def _read_environment() -> dict[str, str]:
    """The `TASKWARD_*` variables (any case) by setting name, or `SettingsError` naming
    the first variable that is no setting or that repeats another's setting."""
    known = {ENV_PREFIX + name.upper() for name in SETTING_NAMES}
    ours = sorted(key for key in os.environ if key[:len(ENV_PREFIX)].upper() == ENV_PREFIX)
    # Not ASCII: `str.upper` would read `ſ` as `S` and take a look-alike for a setting.
    unknown = [key for key in ours if not key.isascii() or key.upper() not in known]
    if unknown:
        raise SettingsError(f"unknown setting {unknown[0]} (known: {', '.join(sorted(known))})")
    values: dict[str, str] = {}
    spelled: dict[str, str] = {}
    for key in ours:
        name = key.upper().removeprefix(ENV_PREFIX).lower()
        if name in spelled:
            raise SettingsError(f"{key.upper()} is set twice, as {spelled[name]} and as {key}: "
                                "unset one of them")
        spelled[name], values[name] = key, os.environ[key]
    return values


def _read_file() -> dict[str, Any]:
    """The settings of `taskward.toml`, none when there is no such name. Whatever else
    has the name (a directory, a FIFO, a dangling link) stops start-up: it was ignored,
    and the operator's settings with it, without a word. Nothing but a regular file is
    opened: opening a FIFO waits for a writer."""
    if not os.path.lexists(TOML_FILE):
        return {}
    import tomllib  # only with a file: its import compiles regexes at every start

    try:
        if not stat.S_ISREG(os.stat(TOML_FILE).st_mode):
            raise SettingsError(f"{TOML_FILE}: cannot read it: {Path(TOML_FILE).absolute()} "
                                "is not a regular file")
        with open(TOML_FILE, "rb") as file:
            return tomllib.load(file)
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{TOML_FILE}: {exc}") from None
    except UnicodeDecodeError as exc:
        raise SettingsError(f"{TOML_FILE}: not UTF-8 text (byte {exc.object[exc.start]:#04x} "
                            f"at offset {exc.start})") from None
    except OSError as exc:
        raise SettingsError(f"{TOML_FILE}: cannot read it: {exc.strerror}") from None


def check_database_url(url: str) -> None:
    """`SettingsError` unless `url` names a store taskward can open: SQLite's file
    (not `:memory:`, which each connection sees apart) through the standard driver,
    or PostgreSQL through psycopg, the driver `core.store.libpq` speaks to.

    Only the URL's form is checked here; whether its file is a store is
    `core.store.connect`'s to find out. The message never quotes the URL: a
    PostgreSQL URL may carry a password.
    """
    from sqlalchemy.engine import make_url  # every caller opens the store next
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
        port = parsed.port
    except ArgumentError:
        raise _bad_url("not a database URL") from None
    except ValueError:  # SQLAlchemy reads the port with int()
        raise _bad_url("its port is not a number") from None
    backend, _, driver = parsed.drivername.partition("+")
    parts = (parsed.username, parsed.password, parsed.host, parsed.database)
    if any("\x00" in part for part in parts if part):
        raise _bad_url("it holds a NUL byte")
    if backend == "sqlite":
        if driver not in ("", "pysqlite"):
            raise _bad_url(f"the SQLite driver {driver} is not pysqlite")
        if parsed.host or parsed.username or port is not None:
            raise _bad_url("a SQLite URL names no host (three slashes before the path)")
        if not parsed.database or parsed.database == ":memory:":
            raise _bad_url("it names no database file")
    elif backend == "postgresql":
        if parsed.host and "@" in parsed.host:
            # SQLAlchemy ends the password at its first `@`: the rest of it would be
            # read as the host and printed in every "failed to resolve host" error.
            raise _bad_url("the password holds an `@` that is not percent-encoded; "
                           "write it as %40")
        if driver not in ("", "psycopg"):
            raise _bad_url(f"the PostgreSQL driver {driver} is not psycopg")
        if port is not None and not 1 <= port <= 65535:
            raise _bad_url("its port is not in 1..65535")
    else:
        raise _bad_url(f"{backend} is neither sqlite nor postgresql")


def _bad_url(what: str) -> SettingRefused:
    return SettingRefused("database_url", f": {what}; expected {DATABASE_URL_FORMS}")


def decode_path(kind: type, value: Any) -> Any:
    """msgspec's `dec_hook` for the one type of a setting it does not convert itself."""
    if kind is Path and isinstance(value, str | Path):
        return Path(value)
    raise TypeError(f"expected a path, got {type(value).__name__}")  # msgspec names the key
