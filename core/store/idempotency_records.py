"""Answers kept under Idempotency-Keys (`idempotency_keys`), for every route that
creates something: a task (`core.store.new_tasks`) or a schedule (`core.schedules`);
and whether a request is a replay of one (`is_replay`), which the rate limits ask.

An answer is recorded in the transaction that created what it answers, and the key's
unique index decides between two creations racing with one key: the one whose record
went in commits, the other rolls back and answers from that record. The record's
`task_id` column names what the request created (a task's id, or a schedule's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, delete, select

from core.errors import InvalidInput
from core.idempotency import IdempotencyClaim
from core.store.bulk import insert_rows
from core.store.database import Database
from core.tables import idempotency_keys


@dataclass(frozen=True)
class StoredAnswer:
    """An answer kept under a key, sent again byte for byte."""

    created_id: str
    status_code: int
    body: bytes


def key_record(
    client_id: str, claim: IdempotencyClaim, created_id: str, status_code: int, body: bytes,
    now: int, ttl_ms: int,
) -> dict[str, Any]:
    """The `idempotency_keys` row that keeps an answer under the client's key."""
    return {"client_id": client_id, "key": claim.key, "request_digest": claim.digest,
            "status_code": status_code, "body": body.decode(), "task_id": created_id,
            "created_at": now, "expires_at": now + ttl_ms}


def record_keys(conn: Connection, records: Sequence[dict[str, Any]]) -> set[str]:
    """Store answers under their keys; the created ids whose key was not recorded before.

    On PostgreSQL a concurrent holder of the same key makes this wait for its commit,
    so exactly one of two racing requests creates anything.
    """
    return {row.task_id for row in insert_rows(conn, idempotency_keys, records,
                                               skip_conflicts=True,
                                               returning=[idempotency_keys.c.task_id])}


def stored_answer(db: Database, client_id: str, claim: IdempotencyClaim) -> StoredAnswer | None:
    """The answer recorded under the client's key, or None (an expired record is
    deleted, so the key is free again). A record of a different request (another body,
    or another route: the digest covers method and path) is `idempotency_key_reused`."""
    key_of = (idempotency_keys.c.client_id == client_id, idempotency_keys.c.key == claim.key)
    with db.write() as conn:
        stored = conn.execute(select(idempotency_keys).where(*key_of)).first()
        if stored is None:
            return None
        if stored.expires_at <= db.clock.now_ms():
            conn.execute(delete(idempotency_keys).where(*key_of))
            return None
    if stored.request_digest != claim.digest:
        raise InvalidInput(
            "idempotency_key_reused",
            "this Idempotency-Key was already used with a different request",
        )
    return StoredAnswer(stored.task_id, stored.status_code, stored.body.encode())


def is_replay(db: Database, client_id: str, claim: IdempotencyClaim) -> bool:
    """Whether `stored_answer` would answer `claim` from its record (one under the
    client's key, not expired, of a request with the same digest), asked without
    writing: such a request creates nothing, so no rate limit need refuse it, and the
    question is cheap enough to ask of every request a limit would refuse. Any other
    request with that key creates or is refused (`idempotency_key_reused`)."""
    with db.read() as conn:
        return conn.execute(select(idempotency_keys.c.key).where(
            idempotency_keys.c.client_id == client_id,
            idempotency_keys.c.key == claim.key,
            idempotency_keys.c.request_digest == claim.digest,
            idempotency_keys.c.expires_at > db.clock.now_ms())).first() is not None
