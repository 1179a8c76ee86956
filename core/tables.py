"""The schema, as SQLAlchemy Core tables. Alembic migrations in `infra/migrations` mirror it.

Times are UTC epoch milliseconds (BIGINT) from `core.clock`; JSON payloads are TEXT
written by us, so both stores read them the same way. Store operations use these
tables with SQLAlchemy Core, where every `WHERE` stays visible; nothing reads rows
through an ORM class, so the schema is declared as plain `Table`s (they were SQLModel
classes used only for their `__table__`, which the type checker could not see).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    TextClause,
    text,
)

from core.states import Status


def status_sql(*states: Status) -> str:
    """The SQL term "`status` is one of `states`", the states written into the text (the
    note above `IS_QUEUED`: a parameter there would have SQLite prepare the statement
    at every execution); for statements written as text for the driver. One state is written
    `status = '…'`, not `IN ('…')`: SQLite does not take the one for the other, so only
    the `=` form can use a partial index whose predicate says `=` (`ix_tasks_due`)."""
    if len(states) == 1:
        return f"status = '{states[0].value}'"
    listed = ", ".join(f"'{state.value}'" for state in states)
    return f"status IN ({listed})"


# The states in a fixed order, the enum's: SQLite matches a partial index's predicate by
# its text, so every process must write each term the same (a set's order is not).
_QUEUED_SQL = status_sql(Status.QUEUED)
_ACTIVE_SQL = status_sql(Status.QUEUED, Status.LOADING, Status.RUNNING, Status.CANCELLING)
_LEASED_SQL = status_sql(Status.LOADING, Status.RUNNING, Status.CANCELLING)
_TERMINAL_SQL = status_sql(Status.COMPLETED, Status.FAILED, Status.CANCELLED)
_DEAD_SQL = "dead_lettered = 1"
# A queued task is either in line (it has a place, `vtime`: due, waiting its fair turn)
# or waiting for its `run_at` (or a retry's backoff) outside the line; `core.store.line`.
_IN_LINE_SQL = f"{_QUEUED_SQL} AND vtime IS NOT NULL"
_OUTSIDE_LINE_SQL = f"{_QUEUED_SQL} AND vtime IS NULL"

# The predicates of the partial indexes on `tasks`, as terms for queries on `tasks`.
# A query can use a partial index only when its WHERE holds the index's predicate
# itself: SQLite compares terms structurally, constants and their order included, and
# a bound parameter cannot be relied on (`status IN (?, ?, ?)` scanned the table, though
# a lone `x = ?` may match once bound); PostgreSQL cannot prove it from a parameter
# either once a statement runs with a generic plan. Without these terms a
# claim or a retention batch scans the whole table, finished history included.
# Nor should a query compare `status` with a bound parameter beside them: SQLite then
# plans with the value bound at the time and prepares the statement again whenever the
# parameter is bound anew, every execution (a claim's resumable candidates took 45 us
# a read, 5 with the state written in the text).
IS_QUEUED: TextClause = text(_QUEUED_SQL)
IS_ACTIVE: TextClause = text(_ACTIVE_SQL)
IS_LEASED: TextClause = text(_LEASED_SQL)
IS_TERMINAL: TextClause = text(_TERMINAL_SQL)
IS_DEAD_LETTER: TextClause = text(_DEAD_SQL)
IS_IN_LINE: TextClause = text(_IN_LINE_SQL)
IS_OUTSIDE_LINE: TextClause = text(_OUTSIDE_LINE_SQL)


def status_in(*states: Status) -> TextClause:
    """`status_sql` as a term of a SQLAlchemy query."""
    return text(status_sql(*states))


def _ms(name: str, nullable: bool = False, index: bool = False) -> Column[int]:
    """A time column: UTC epoch milliseconds from the clock object."""
    return Column(name, BigInteger, nullable=nullable, index=index)


class _PartialIndex(Index):
    """An index over the rows `where` holds, on both stores alike.

    `where` reaches the dialects' options (`sqlite_where`, `postgresql_where`: DDL,
    alembic's rendering and comparison) when they are first asked for, not when the
    index is declared: SQLAlchemy imports a dialect's package to check the options
    named for it, so declaring them here made every process import both stores'
    dialects at start-up, the one it does not use included (~100 M instructions for
    PostgreSQL's on SQLite, ~30 M for SQLite's on PostgreSQL; issue 15).
    """

    def __init__(self, name: str, *columns: str, where: str, unique: bool = False) -> None:
        super().__init__(name, *columns, unique=unique)
        self._where = where

    @cached_property
    def dialect_options(self) -> Any:
        options = super().dialect_options
        for dialect in ("sqlite", "postgresql"):
            options[dialect]["where"] = text(self._where)
        return options


def _partial(name: str, *columns: str, where: str, unique: bool = False) -> Index:
    return _PartialIndex(name, *columns, where=where, unique=unique)


def _limit_columns() -> list[Column[object]]:
    """A client's quotas (`core.quotas`); NULL: the setting's default."""
    return [Column("max_active_tasks", Integer, nullable=True),
            Column("requests_per_second", Float, nullable=True),
            Column("max_streams", Integer, nullable=True)]


metadata = MetaData()

# Service identity and settings that must survive restarts (key/value).
service_config = Table(
    "service_config", metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)

clients = Table(
    "clients", metadata,
    Column("id", String(40), primary_key=True),
    Column("name", String(200), nullable=False),
    Column("token_hash", String(64), nullable=False, unique=True),
    Column("scopes", Text, nullable=False),  # space separated
    _ms("created_at"),
    _ms("revoked_at", nullable=True),
    *_limit_columns(),
    _ms("limits_changed_at", nullable=True),
)

# One-time pairing codes: `<id>-<secret>`, only the secret's hash is kept.
pairing_codes = Table(
    "pairing_codes", metadata,
    Column("id", String(40), primary_key=True),
    Column("secret_hash", String(64), nullable=False),
    Column("scopes", Text, nullable=False),
    Column("name", String(200), nullable=True),
    _ms("created_at"),
    _ms("expires_at", index=True),
    Column("failures", Integer, nullable=False, server_default="0"),
    _ms("used_at", nullable=True),
    *_limit_columns(),  # the limits the redeeming client gets
    # The client that made it (NULL: an operator's `taskward pair`): once that client
    # is revoked, its codes no longer redeem.
    Column("created_by", String(40), nullable=True),
)

# A file entry (path, size, digest) or an upstream entry (`upstream`, the JSON of its
# servers, and `max_concurrency`, the fleet-wide bound a claim checks; docs/upstream.md).
models = Table(
    "models", metadata,
    Column("id", String(200), primary_key=True),
    Column("engine", String(64), nullable=False),
    Column("path", Text, nullable=True),
    Column("size_bytes", BigInteger, nullable=True),
    Column("sha256", String(64), nullable=True),
    _ms("created_at"),
    Column("metadata", Text, key="metadata_json", nullable=False),
    Column("upstream", Text, key="upstream_json", nullable=True),
    Column("max_concurrency", Integer, nullable=True),
)

# Upstream failures seen by the sweepers, counted per (model, code), for /metrics.
upstream_errors = Table(
    "upstream_errors", metadata,
    Column("model_id", String(200), primary_key=True),
    Column("code", String(64), primary_key=True),
    Column("count", BigInteger, nullable=False),
    _ms("last_at"),
)

# Until when a sweeper skips a base URL that refused or timed out, for /metrics.
upstream_cooldowns = Table(
    "upstream_cooldowns", metadata,
    Column("model_id", String(200), primary_key=True),
    Column("base_url", String(2048), primary_key=True),
    _ms("until"),
)

tasks = Table(
    "tasks", metadata,
    Column("id", String(40), primary_key=True),
    Column("client_id", String(40), nullable=False),
    Column("model", String(200), nullable=False),
    Column("status", String(16), nullable=False),
    Column("on_restart", String(8), nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    _ms("created_at"),
    _ms("updated_at"),
    _ms("run_at"),
    _ms("started_at", nullable=True),
    _ms("finished_at", nullable=True),
    Column("owner_token", String(40), nullable=True),
    _ms("lease_expires_at", nullable=True),
    Column("node_id", String(200), nullable=True),
    Column("last_seq", Integer, nullable=False),
    Column("dedupe_key", String(255), nullable=True),
    Column("error_code", String(64), nullable=True),
    Column("error_message", String(500), nullable=True),
    Column("dead_lettered", Integer, nullable=False, server_default="0"),
    Column("metadata", Text, key="metadata_json", nullable=False),
    Column("request", Text, key="request_json", nullable=False),
    Column("snapshot", Text, key="snapshot_json", nullable=True),
    Column("schedule_id", String(40), nullable=True),
    Column("retry_of", String(40), nullable=True),
    Column("priority", Integer, nullable=False, server_default="5"),
    Column("vtime", BigInteger, nullable=True),  # place in the fair line
    _partial("ix_tasks_due", "run_at", "id", where=_QUEUED_SQL),
    _partial("ix_tasks_leases", "lease_expires_at", where=_LEASED_SQL),
    # An upstream model's attempts in flight, counted by every claim of its tasks.
    _partial("ix_tasks_model_leased", "model", "lease_expires_at", where=_LEASED_SQL),
    Index("ix_tasks_client", "client_id", "id"),
    # Covers the count of live tasks by state (/metrics, the console's overview):
    # SQLite counts it from the index alone instead of visiting every live row.
    _partial("ix_tasks_active_status", "status", where=_ACTIVE_SQL),
    _partial("ix_tasks_node", "node_id", where=_ACTIVE_SQL),
    _partial("ix_tasks_finished", "finished_at", where=_TERMINAL_SQL),
    _partial("ix_tasks_dead", "id", where=_DEAD_SQL),
    _partial("ix_tasks_line", "priority", "vtime", "id", where=_IN_LINE_SQL),
    _partial("ix_tasks_client_line", "client_id", "priority", "vtime", where=_IN_LINE_SQL),
    _partial("ix_tasks_outside_line", "run_at", "id", where=_OUTSIDE_LINE_SQL),
    _partial("ix_tasks_client_outside_line", "client_id", "run_at", "id", where=_OUTSIDE_LINE_SQL),
    _partial("ix_tasks_client_active", "client_id", where=_ACTIVE_SQL),
    _partial("ux_tasks_dedupe", "client_id", "dedupe_key", unique=True,
             where=f"dedupe_key IS NOT NULL AND {_ACTIVE_SQL}"),
    # At most one active retry of a failed task: asked twice, a retry answers the first.
    _partial("ux_tasks_retry", "retry_of", unique=True,
             where=f"retry_of IS NOT NULL AND {_ACTIVE_SQL}"),
)

# The response a task builds: output text so far and usage.
responses = Table(
    "responses", metadata,
    Column("task_id", String(40), primary_key=True),
    Column("output_text", Text, nullable=False, server_default=""),
    Column("input_tokens", Integer, nullable=False, server_default="0"),
    Column("output_tokens", Integer, nullable=False, server_default="0"),
    _ms("updated_at"),
)

# Append-only per-task log. `data` holds the event's own fields; `type`,
# `sequence_number` and the lifecycle `response` are added when it is read.
task_events = Table(
    "task_events", metadata,
    Column("task_id", String(40), primary_key=True),
    Column("seq", Integer, primary_key=True, autoincrement=False),
    Column("type", String(64), nullable=False),
    _ms("created_at"),
    Column("data", Text, nullable=False),
)

idempotency_keys = Table(
    "idempotency_keys", metadata,
    Column("client_id", String(40), primary_key=True),
    Column("key", String(255), primary_key=True),
    Column("request_digest", String(64), nullable=False),
    Column("status_code", Integer, nullable=False),
    Column("body", Text, nullable=False),
    Column("task_id", String(40), nullable=False),
    _ms("created_at"),
    _ms("expires_at", index=True),
)

schedules = Table(
    "schedules", metadata,
    Column("id", String(40), primary_key=True),
    Column("client_id", String(40), nullable=False, index=True),
    Column("cron", String(200), nullable=False),
    Column("request", Text, key="request_json", nullable=False),
    Column("catch_up", Integer, nullable=False),
    _ms("checkpoint"),  # every slot <= checkpoint has been handled
    _ms("next_slot_at", index=True),
    _ms("created_at"),
    _ms("updated_at"),
)

# Ledger: one row per fired slot, unique, so a slot yields at most one task.
schedule_slots = Table(
    "schedule_slots", metadata,
    Column("schedule_id", String(40), primary_key=True),
    Column("slot_at", BigInteger, primary_key=True, autoincrement=False),
    Column("task_id", String(40), nullable=False),
    _ms("created_at"),
)

# A browser's login to the operator console: only the cookie secret's hash is kept, so
# a copy of the table opens no session; deleting the row ends the session.
console_sessions = Table(
    "console_sessions", metadata,
    Column("secret_hash", String(64), primary_key=True),
    Column("client_id", String(40), nullable=False),
    _ms("created_at"),
    _ms("expires_at", index=True),
)
