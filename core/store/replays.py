"""Whether a request repeats one answered under its Idempotency-Key, asked without
writing: such a request creates nothing (`enqueue` answers it from the record), so no
rate limit need refuse it, and the question is cheap enough to ask of every request a
limit would refuse."""

from __future__ import annotations

from sqlalchemy import select

from core.idempotency import IdempotencyClaim
from core.store.database import Database
from core.tables import idempotency_keys


def is_replay(db: Database, client_id: str, claim: IdempotencyClaim) -> bool:
    """Whether `enqueue` would answer `claim` from its record: one stored under the
    client's key, not expired, for a request of the same digest. Any other request with
    that key creates a task or is refused (`idempotency_key_reused`)."""
    with db.read() as conn:
        return conn.execute(select(idempotency_keys.c.key).where(
            idempotency_keys.c.client_id == client_id,
            idempotency_keys.c.key == claim.key,
            idempotency_keys.c.request_digest == claim.digest,
            idempotency_keys.c.expires_at > db.clock.now_ms())).first() is not None
