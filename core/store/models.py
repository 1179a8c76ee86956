"""The model registry's rows (what registering checks: `core.models_registry`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from sqlalchemy import Connection, Row, bindparam, delete, select

from core.errors import Conflict, NotFound
from core.store.bulk import insert_rows
from core.store.database import Database
from core.tables import models, upstream_cooldowns, upstream_errors


class ModelEntry(NamedTuple):
    """What a worker checks before a task uses a model: the registry row's fields, read
    in the claim's own transaction (`core.store.claims`) rather than in one more."""

    id: str
    engine: str
    path: str | None
    size_bytes: int | None
    sha256: str | None
    metadata_json: str
    upstream_json: str | None
    max_concurrency: int | None


ENTRY_COLUMNS = [models.c[name] for name in ModelEntry._fields]
_ENTRIES = select(*ENTRY_COLUMNS).where(models.c.id.in_(bindparam("p_ids", expanding=True)))


def entries(conn: Connection, model_ids: Iterable[str]) -> dict[str, ModelEntry]:
    """The registry entries of `model_ids` that exist, by id."""
    wanted = sorted(set(model_ids))
    if not wanted:
        return {}
    return {row.id: ModelEntry(*row) for row in conn.execute(_ENTRIES, {"p_ids": wanted})}


def read_entries(db: Database, model_ids: Iterable[str]) -> dict[str, ModelEntry]:
    """`entries` in a read transaction of their own."""
    with db.read() as conn:
        return entries(conn, model_ids)


def insert_model(db: Database, values: dict[str, Any]) -> Row[Any]:
    """Store a registry entry, stamped with the clock; an id already taken is a conflict."""
    with db.write() as conn:
        inserted = insert_rows(conn, models, [{**values, "created_at": db.clock.now_ms()}],
                               skip_conflicts=True, returning=[models.c.id])
        if not inserted:
            raise Conflict("model_exists",
                           f"a model with id {values['id']!r} is already registered")
        return conn.execute(select(models).where(models.c.id == values["id"])).one()


def find_model(db: Database, model_id: str) -> Row[Any] | None:
    with db.read() as conn:
        return conn.execute(select(models).where(models.c.id == model_id)).first()


def get_model(db: Database, model_id: str) -> Row[Any]:
    row = find_model(db, model_id)
    if row is None:
        raise NotFound("model_not_found", "no model is registered under that id")
    return row


def list_models(db: Database) -> list[Row[Any]]:
    with db.read() as conn:
        return list(conn.execute(select(models).order_by(models.c.id)))


def remove(db: Database, model_id: str) -> None:
    """Remove the entry (and what /metrics kept of its upstream); the file is never deleted."""
    with db.write() as conn:
        if conn.execute(delete(models).where(models.c.id == model_id)).rowcount == 0:
            raise NotFound("model_not_found", "no model is registered under that id")
        for table in (upstream_errors, upstream_cooldowns):
            conn.execute(delete(table).where(table.c.model_id == model_id))
