"""One typed settings object, read once at start-up and passed down.

Sources, strongest first: `TASKWARD_*` environment variables, then an optional
`taskward.toml` in the working directory (keys without the prefix, lower case).
Parsing is strict: an unknown key, a bad value or an inconsistent pair stops start-up
with a message that names the key.

The two sources are read here, on a plain pydantic model, rather than by
pydantic-settings: that package's import (its every source provider, dotenv, the CLI
parser) was ~55 ms of CPU at the start of every process, a sweeper's included, for
two sources of a dozen lines (docs/benchmarks.md, issue 15).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from core.cron import parse_cron
from core.engines.base import usable_cores
from core.errors import InvalidInput

ENV_PREFIX = "TASKWARD_"
TOML_FILE = "taskward.toml"


class SettingsError(Exception):
    """Start-up configuration is unusable; the message names the key."""


class Settings(BaseModel):
    """Every setting; building one reads the sources (`_read_sources`), so
    `Settings(key=value)` is the environment and the file with `key` overridden."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    database_url: str = "sqlite:///./var/taskward.db"
    models_dir: Path = Path("./models")
    node_id: str = Field(default_factory=socket.gethostname, min_length=1, max_length=200)
    lease_seconds: float = Field(30, gt=0)
    heartbeat_seconds: float = Field(10, gt=0)
    # The engine batches a model's attempts: raise it to 8 for throughput (docs/operations.md).
    worker_concurrency: int = Field(2, ge=1, le=256)
    sweep_schedule: str = "* * * * *"
    task_timeout_seconds: float = Field(600, gt=0)
    max_attempts_default: int = Field(3, ge=1)
    max_attempts_cap: int = Field(10, ge=1, le=1000)
    retention_hours: float = Field(168, gt=0)
    idempotency_ttl_hours: float = Field(24, gt=0)
    max_body_bytes: int = Field(1_048_576, ge=1024)
    # Knobs a production operator expects to have (docs/settings.md lists them all).
    sqlite_synchronous: Literal["FULL", "NORMAL"] = "FULL"
    sqlite_busy_timeout_ms: int = Field(10_000, ge=0)
    # One decode loop per loaded model computes with this many threads, whatever the
    # concurrency; more threads than usable cores only spin (docs/operations.md).
    engine_threads: int = Field(default_factory=usable_cores, ge=1, le=256)
    engine_context_tokens: int = Field(8192, ge=256, le=1_048_576)
    # Opt-in: every taskward process on a host takes turns on this file around each
    # compute step. Off by default: with the engine's short OpenMP spin, two processes without
    # it did better in every measured run (docs/benchmarks.md, "Two processes").
    engine_host_lock: str = ""
    model_cache_size: int = Field(2, ge=1, le=32)
    sync_timeout_seconds: float = Field(60, gt=0, le=600)
    pairing_code_ttl_seconds: float = Field(600, gt=0)
    retention_batch_size: int = Field(2000, ge=1, le=100_000)
    flush_interval_ms: int = Field(100, ge=1, le=10_000)
    flush_bytes: int = Field(512, ge=1)
    drain_seconds: float = Field(20, ge=0)
    backoff_base_seconds: float = Field(2, gt=0)
    backoff_max_seconds: float = Field(300, gt=0)
    poll_interval_ms: int = Field(50, ge=5, le=10_000)
    # Slow clients (docs/operations.md): a connection that sends no complete request
    # head for this long is closed (a fresh idle one, a keep-alive one, trickled
    # headers), and a request body that stalls this long between pieces gets a 408.
    # 0 turns one off (only for measuring what it costs: bench/http.py).
    http_idle_timeout_seconds: float = Field(30, ge=0, le=3600)
    http_body_timeout_seconds: float = Field(30, ge=0, le=3600)
    console_session_hours: float = Field(8, gt=0, le=720)  # an operator console login
    # Per-client defaults (`core.quotas`): a client's own value, when set, wins.
    client_max_active_tasks: int = Field(0, ge=0)  # 0 = unlimited
    client_requests_per_second: float = Field(0, ge=0)  # 0 = unlimited
    client_max_streams: int = Field(100, ge=1)
    # Extra engine plug-ins: comma-separated module names imported at start-up, each
    # registering engines with `core.engines.registry.register_engine`.
    engine_modules: str = ""
    # Upstream engines (docs/upstream.md): slots per process for upstream attempts, apart
    # from the local engine's; host patterns an upstream URL must match (comma-separated,
    # `*` wildcards; empty: any host); how long a failing base URL is skipped.
    upstream_concurrency: int = Field(64, ge=1, le=4096)
    upstream_allowed_hosts: str = ""
    upstream_cooldown_seconds: float = Field(10, gt=0, le=3600)

    @model_validator(mode="before")
    @classmethod
    def _read_sources(cls, values: dict[str, Any]) -> dict[str, Any]:
        """Keyword arguments win over `TASKWARD_*` variables (names case-insensitive),
        which win over `taskward.toml` in the working directory."""
        from_file: dict[str, Any] = {}
        if Path(TOML_FILE).is_file():
            import tomllib  # only with a file: its import compiles regexes at every start

            with open(TOML_FILE, "rb") as file:
                try:
                    from_file = tomllib.load(file)
                except tomllib.TOMLDecodeError as exc:
                    raise ValueError(f"{TOML_FILE}: {exc}") from None
        prefix = ENV_PREFIX.lower()
        from_env = {key.lower().removeprefix(prefix): value
                    for key, value in os.environ.items() if key.lower().startswith(prefix)}
        return {**from_file,
                **{name: from_env[name] for name in cls.model_fields if name in from_env},
                **values}

    @field_validator("sweep_schedule")
    @classmethod
    def _cron_parses(cls, value: str) -> str:
        try:
            parse_cron(value)  # the one meaning of a cron expression, as schedules have
        except InvalidInput as exc:
            raise ValueError(exc.message) from None
        return value

    @field_validator("models_dir")
    @classmethod
    def _absolute_models_dir(cls, value: Path) -> Path:
        # Model paths are stored relative to this directory and joined with it later;
        # anchoring it once at start-up keeps "./models" from meaning two places.
        return value.expanduser().absolute()

    @field_validator("database_url")
    @classmethod
    def _known_store(cls, value: str) -> str:
        if not (value.startswith("sqlite:///") or value.startswith("postgresql")):
            raise ValueError("must be sqlite:///PATH or postgresql+psycopg://…")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if self.heartbeat_seconds >= self.lease_seconds:
            raise ValueError(
                "TASKWARD_HEARTBEAT_SECONDS must be shorter than TASKWARD_LEASE_SECONDS"
            )
        if self.max_attempts_default > self.max_attempts_cap:
            raise ValueError(
                "TASKWARD_MAX_ATTEMPTS_DEFAULT must not exceed TASKWARD_MAX_ATTEMPTS_CAP"
            )
        if self.backoff_base_seconds > self.backoff_max_seconds:
            raise ValueError(
                "TASKWARD_BACKOFF_BASE_SECONDS must not exceed TASKWARD_BACKOFF_MAX_SECONDS"
            )
        return self

    @property
    def engine_module_names(self) -> list[str]:
        return [name.strip() for name in self.engine_modules.split(",") if name.strip()]

    @property
    def upstream_host_patterns(self) -> tuple[str, ...]:
        return tuple(p.strip().lower() for p in self.upstream_allowed_hosts.split(",")
                     if p.strip())

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")


def load_settings(**overrides: object) -> Settings:
    """Settings from the environment and `taskward.toml`, or `SettingsError` naming the key."""
    known = {ENV_PREFIX + name.upper() for name in Settings.model_fields}
    unknown = sorted(k for k in os.environ if k.startswith(ENV_PREFIX) and k not in known)
    if unknown:
        raise SettingsError(f"unknown setting {unknown[0]} (known: {', '.join(sorted(known))})")
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ENV_PREFIX + str(first["loc"][0]).upper() if first["loc"] else "settings"
        message = str(first["msg"]).removeprefix("Value error, ")
        raise SettingsError(f"{key}: {message}") from None
