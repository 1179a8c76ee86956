"""The model registry's rows (what registering checks: `core.models_registry`)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Row, delete, select

from core.errors import Conflict, NotFound
from core.store.bulk import insert_rows
from core.store.database import Database
from core.tables import models, upstream_cooldowns, upstream_errors


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
