"""Console sessions in the store (what they are: `core.console_sessions`): the hash of
each session secret, its client and its expiry."""

from __future__ import annotations

from sqlalchemy import bindparam, delete, insert, select

from core.clients import ADMIN, Client, scope_set
from core.console_sessions import SECRET_BYTES, ConsoleSession, csrf_token_of, plausible_secret
from core.errors import Forbidden
from core.ids import hash_secret, new_secret
from core.store.clients import authenticate
from core.store.database import Database
from core.tables import clients, console_sessions


def log_in(db: Database, token: str, *, ttl_ms: int) -> str:
    """A new session secret for an active `admin` client's token.

    Unknown and revoked tokens are `invalid_token` (401), a client without `admin` is
    `admin_required` (403): the console is for operators only.
    """
    client, _ = authenticate(db, token)
    if ADMIN not in client.scopes:
        raise Forbidden("admin_required", "the console is open to admin tokens only")
    secret = new_secret(SECRET_BYTES)
    with db.write() as conn:
        now = db.clock.now_ms()
        conn.execute(insert(console_sessions).values(
            secret_hash=hash_secret(secret), client_id=client.id, created_at=now,
            expires_at=now + ttl_ms))
    return secret


_LIVE_SESSION = (
    select(clients.c.id, clients.c.name, clients.c.scopes)
    .select_from(console_sessions.join(clients, clients.c.id == console_sessions.c.client_id))
    .where(console_sessions.c.secret_hash == bindparam("secret_hash"),
           console_sessions.c.expires_at > bindparam("now"),
           clients.c.revoked_at.is_(None))
)


def session_of(db: Database, secret: str, now: int) -> ConsoleSession | None:
    """The live session holding `secret`, or None (unknown, expired, ended, revoked, or
    its client no longer holds `admin`)."""
    if not plausible_secret(secret):
        return None
    with db.read() as conn:
        row = conn.execute(_LIVE_SESSION,
                           {"secret_hash": hash_secret(secret), "now": now}).first()
    if row is None:
        return None
    scopes = scope_set(row.scopes)
    if ADMIN not in scopes:
        return None
    return ConsoleSession(Client(row.id, row.name, scopes), csrf_token_of(secret))


def log_out(db: Database, secret: str) -> None:
    """End the session holding `secret` (nothing to do when there is none)."""
    if not plausible_secret(secret):
        return
    with db.write() as conn:
        conn.execute(delete(console_sessions)
                     .where(console_sessions.c.secret_hash == hash_secret(secret)))
