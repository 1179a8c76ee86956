"""Console sessions in the store: they expire, and the sweeper's retention removes them."""

from __future__ import annotations

from sqlalchemy import func, select

from core.clients import IssuedToken
from core.store.console_sessions import log_in, session_of
from core.store.database import Database
from core.store.retention import remove_expired
from core.tables import console_sessions
from tests.clocks import HandClock

HOUR_MS = 3_600_000


def _sessions(db: Database) -> int:
    with db.read() as conn:
        return conn.execute(select(func.count()).select_from(console_sessions)).scalar_one()


def test_a_session_ends_when_it_expires(db: Database, admin: IssuedToken) -> None:
    secret = log_in(db, admin.token, ttl_ms=HOUR_MS)
    now = db.clock.now_ms()
    live = session_of(db, secret, now)
    assert live is not None and live.client.id == admin.client_id
    assert session_of(db, secret, now + HOUR_MS + 1) is None


def test_the_store_keeps_only_a_hash_of_the_session_secret(db: Database,
                                                           admin: IssuedToken) -> None:
    secret = log_in(db, admin.token, ttl_ms=HOUR_MS)
    with db.read() as conn:
        stored = conn.execute(select(console_sessions)).one()
    assert secret not in tuple(str(value) for value in stored)
    assert admin.token not in tuple(str(value) for value in stored)


def test_retention_removes_expired_sessions_only(db: Database, admin: IssuedToken) -> None:
    clock = HandClock(1_800_000_000_000)
    db.clock = clock
    log_in(db, admin.token, ttl_ms=HOUR_MS)
    kept = log_in(db, admin.token, ttl_ms=3 * HOUR_MS)
    clock.ms += 2 * HOUR_MS

    removed = remove_expired(db, retention_ms=HOUR_MS, batch_size=100)

    assert removed.console_sessions == 1
    assert _sessions(db) == 1
    assert session_of(db, kept, clock.ms) is not None
