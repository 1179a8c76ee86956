"""The schema, as SQLModel tables. Alembic migrations in `infra/migrations` mirror it.

Times are UTC epoch milliseconds (BIGINT) from `core.clock`; JSON payloads are TEXT
written by us, so both stores read them the same way. Store operations use the
`__table__` objects with SQLAlchemy Core, where every `WHERE` stays visible.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Index, Integer, String, Text, TextClause, text
from sqlmodel import Field, SQLModel

_QUEUED_SQL = "status = 'queued'"
_ACTIVE_SQL = "status IN ('queued', 'loading', 'running', 'cancelling')"
_LEASED_SQL = "status IN ('loading', 'running', 'cancelling')"
_TERMINAL_SQL = "status IN ('completed', 'failed', 'cancelled')"
_DEAD_SQL = "dead_lettered = 1"

# The predicates of the partial indexes on `tasks`, as terms for queries on `tasks`.
# A query can use a partial index only when its WHERE holds the index's predicate
# itself: SQLite compares terms structurally, constants and their order included, and
# a bound parameter cannot be relied on (`status IN (?, ?, ?)` scanned the table, though
# a lone `x = ?` may match once bound); PostgreSQL cannot prove it from a parameter
# either once a statement runs with a generic plan. Without these terms a
# claim or a retention batch scans the whole table, finished history included.
IS_QUEUED: TextClause = text(_QUEUED_SQL)
IS_ACTIVE: TextClause = text(_ACTIVE_SQL)
IS_LEASED: TextClause = text(_LEASED_SQL)
IS_TERMINAL: TextClause = text(_TERMINAL_SQL)
IS_DEAD_LETTER: TextClause = text(_DEAD_SQL)


def _ms(nullable: bool = False, index: bool = False) -> object:
    return Field(sa_column=Column(BigInteger, nullable=nullable, index=index))


class ServiceConfig(SQLModel, table=True):
    """Service identity and settings that must survive restarts (key/value)."""

    __tablename__ = "service_config"
    key: str = Field(sa_column=Column(String(64), primary_key=True))
    value: str = Field(sa_column=Column(Text, nullable=False))


class ClientRow(SQLModel, table=True):
    __tablename__ = "clients"
    id: str = Field(sa_column=Column(String(40), primary_key=True))
    name: str = Field(sa_column=Column(String(200), nullable=False))
    token_hash: str = Field(sa_column=Column(String(64), nullable=False, unique=True))
    scopes: str = Field(sa_column=Column(Text, nullable=False))  # space separated
    created_at: int = _ms()
    revoked_at: int | None = _ms(nullable=True)


class PairingCodeRow(SQLModel, table=True):
    """One-time pairing codes: `<id>-<secret>`, only the secret's hash is kept."""

    __tablename__ = "pairing_codes"
    id: str = Field(sa_column=Column(String(40), primary_key=True))
    secret_hash: str = Field(sa_column=Column(String(64), nullable=False))
    scopes: str = Field(sa_column=Column(Text, nullable=False))
    name: str | None = Field(sa_column=Column(String(200), nullable=True))
    created_at: int = _ms()
    expires_at: int = _ms(index=True)
    failures: int = Field(sa_column=Column(Integer, nullable=False, server_default="0"))
    used_at: int | None = _ms(nullable=True)


class ModelRow(SQLModel, table=True):
    __tablename__ = "models"
    id: str = Field(sa_column=Column(String(200), primary_key=True))
    engine: str = Field(sa_column=Column(String(64), nullable=False))
    path: str = Field(sa_column=Column(Text, nullable=False))
    size_bytes: int = Field(sa_column=Column(BigInteger, nullable=False))
    sha256: str = Field(sa_column=Column(String(64), nullable=False))
    created_at: int = _ms()
    metadata_json: str = Field(
        sa_column=Column("metadata", Text, key="metadata_json", nullable=False))


class TaskRow(SQLModel, table=True):
    __tablename__ = "tasks"
    __table_args__ = (
        Index("ix_tasks_due", "run_at", "id", sqlite_where=text(_QUEUED_SQL),
              postgresql_where=text(_QUEUED_SQL)),
        Index("ix_tasks_leases", "lease_expires_at", sqlite_where=text(_LEASED_SQL),
              postgresql_where=text(_LEASED_SQL)),
        Index("ix_tasks_client", "client_id", "id"),
        Index("ix_tasks_node", "node_id", sqlite_where=text(_ACTIVE_SQL),
              postgresql_where=text(_ACTIVE_SQL)),
        Index("ix_tasks_finished", "finished_at", sqlite_where=text(_TERMINAL_SQL),
              postgresql_where=text(_TERMINAL_SQL)),
        Index("ix_tasks_dead", "id", sqlite_where=text(_DEAD_SQL),
              postgresql_where=text(_DEAD_SQL)),
        Index("ux_tasks_dedupe", "client_id", "dedupe_key", unique=True,
              sqlite_where=text(f"dedupe_key IS NOT NULL AND {_ACTIVE_SQL}"),
              postgresql_where=text(f"dedupe_key IS NOT NULL AND {_ACTIVE_SQL}")),
    )
    id: str = Field(sa_column=Column(String(40), primary_key=True))
    client_id: str = Field(sa_column=Column(String(40), nullable=False))
    model: str = Field(sa_column=Column(String(200), nullable=False))
    status: str = Field(sa_column=Column(String(16), nullable=False))
    on_restart: str = Field(sa_column=Column(String(8), nullable=False))
    attempts: int = Field(sa_column=Column(Integer, nullable=False))
    max_attempts: int = Field(sa_column=Column(Integer, nullable=False))
    created_at: int = _ms()
    updated_at: int = _ms()
    run_at: int = _ms()
    started_at: int | None = _ms(nullable=True)
    finished_at: int | None = _ms(nullable=True)
    owner_token: str | None = Field(sa_column=Column(String(40), nullable=True))
    lease_expires_at: int | None = _ms(nullable=True)
    node_id: str | None = Field(sa_column=Column(String(200), nullable=True))
    last_seq: int = Field(sa_column=Column(Integer, nullable=False))
    dedupe_key: str | None = Field(sa_column=Column(String(255), nullable=True))
    error_code: str | None = Field(sa_column=Column(String(64), nullable=True))
    error_message: str | None = Field(sa_column=Column(String(500), nullable=True))
    dead_lettered: int = Field(sa_column=Column(Integer, nullable=False, server_default="0"))
    metadata_json: str = Field(
        sa_column=Column("metadata", Text, key="metadata_json", nullable=False))
    request_json: str = Field(sa_column=Column("request", Text, key="request_json", nullable=False))
    snapshot_json: str | None = Field(
        sa_column=Column("snapshot", Text, key="snapshot_json", nullable=True))
    schedule_id: str | None = Field(sa_column=Column(String(40), nullable=True))
    retry_of: str | None = Field(sa_column=Column(String(40), nullable=True))


class ResponseRow(SQLModel, table=True):
    """The response a task builds: output text so far and usage."""

    __tablename__ = "responses"
    task_id: str = Field(sa_column=Column(String(40), primary_key=True))
    output_text: str = Field(sa_column=Column(Text, nullable=False, server_default=""))
    input_tokens: int = Field(sa_column=Column(Integer, nullable=False, server_default="0"))
    output_tokens: int = Field(sa_column=Column(Integer, nullable=False, server_default="0"))
    updated_at: int = _ms()


class TaskEventRow(SQLModel, table=True):
    """Append-only per-task log. `data` holds the event's own fields; `type`,
    `sequence_number` and the lifecycle `response` are added when it is read."""

    __tablename__ = "task_events"
    task_id: str = Field(sa_column=Column(String(40), primary_key=True))
    seq: int = Field(sa_column=Column(Integer, primary_key=True, autoincrement=False))
    type: str = Field(sa_column=Column(String(64), nullable=False))
    created_at: int = _ms()
    data: str = Field(sa_column=Column(Text, nullable=False))


class IdempotencyKeyRow(SQLModel, table=True):
    __tablename__ = "idempotency_keys"
    client_id: str = Field(sa_column=Column(String(40), primary_key=True))
    key: str = Field(sa_column=Column(String(255), primary_key=True))
    request_digest: str = Field(sa_column=Column(String(64), nullable=False))
    status_code: int = Field(sa_column=Column(Integer, nullable=False))
    body: str = Field(sa_column=Column(Text, nullable=False))
    task_id: str = Field(sa_column=Column(String(40), nullable=False))
    created_at: int = _ms()
    expires_at: int = _ms(index=True)


class ScheduleRow(SQLModel, table=True):
    __tablename__ = "schedules"
    id: str = Field(sa_column=Column(String(40), primary_key=True))
    client_id: str = Field(sa_column=Column(String(40), nullable=False, index=True))
    cron: str = Field(sa_column=Column(String(200), nullable=False))
    request_json: str = Field(sa_column=Column("request", Text, key="request_json", nullable=False))
    catch_up: int = Field(sa_column=Column(Integer, nullable=False))
    checkpoint: int = _ms()  # every slot <= checkpoint has been handled
    next_slot_at: int = _ms(index=True)
    created_at: int = _ms()
    updated_at: int = _ms()


class ScheduleSlotRow(SQLModel, table=True):
    """Ledger: one row per fired slot, unique, so a slot yields at most one task."""

    __tablename__ = "schedule_slots"
    schedule_id: str = Field(sa_column=Column(String(40), primary_key=True))
    slot_at: int = Field(sa_column=Column(BigInteger, primary_key=True, autoincrement=False))
    task_id: str = Field(sa_column=Column(String(40), nullable=False))
    created_at: int = _ms()


metadata = SQLModel.metadata
service_config = ServiceConfig.__table__
clients = ClientRow.__table__
pairing_codes = PairingCodeRow.__table__
models = ModelRow.__table__
tasks = TaskRow.__table__
responses = ResponseRow.__table__
task_events = TaskEventRow.__table__
idempotency_keys = IdempotencyKeyRow.__table__
schedules = ScheduleRow.__table__
schedule_slots = ScheduleSlotRow.__table__
