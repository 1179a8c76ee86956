"""Clients, bearer tokens, scopes and one-time pairing codes (SPEC section 2).

Only hashes of tokens and pairing secrets are stored. A pairing code is
`<code id>-<secret>`: the id finds the row, so a wrong secret can be counted against
that code and the code burnt after `MAX_PAIRING_FAILURES`, without ever storing the
secret itself. Every check that compares a secret uses `core.ids.same_secret`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Row, bindparam, func, insert, select, update

from core.clock import iso
from core.errors import InvalidInput, NotFound, Unauthorized
from core.ids import hash_secret, new_secret, new_token, random_id, same_secret, sortable_id
from core.settings import Settings
from core.store.database import Database
from core.tables import clients, pairing_codes

ADMIN = "admin"
SCOPES: tuple[str, ...] = (
    "responses:create",
    "tasks:read",
    "tasks:cancel",
    "models:read",
    "models:admin",
    "clients:admin",
    ADMIN,
)
# What a paired client gets when nobody says otherwise: it can do its own work.
DEFAULT_SCOPES: frozenset[str] = frozenset(
    {"responses:create", "tasks:read", "tasks:cancel", "models:read"}
)
MAX_PAIRING_FAILURES = 5
DEFAULT_CLIENT_NAME = "client"
_CODE = re.compile(r"^(pc_[0-9a-z]{20})-([A-Za-z0-9_-]{1,64})$")


@dataclass(frozen=True)
class Client:
    """An authenticated caller. `admin` implies every other scope."""

    id: str
    name: str
    scopes: frozenset[str]

    def allows(self, scope: str) -> bool:
        return ADMIN in self.scopes or scope in self.scopes

    @property
    def owner_filter(self) -> str | None:
        """The client id that store reads are limited to; None when it may see all."""
        return None if ADMIN in self.scopes else self.id


@dataclass(frozen=True)
class IssuedCode:
    code: str
    expires_at: int
    scopes: frozenset[str]

    def public(self) -> dict[str, Any]:
        """`{"code", "expires_at", "scopes"}`, as the API and `taskward pair --json` show it."""
        return {"code": self.code, "expires_at": iso(self.expires_at),
                "scopes": sorted(self.scopes)}


@dataclass(frozen=True)
class IssuedToken:
    """A new client's credentials; the token is shown here once and never again."""

    client_id: str
    token: str
    scopes: frozenset[str]

    def public(self) -> dict[str, Any]:
        """`{"client_id", "token", "scopes"}`, as `POST /v1/pair` and the CLI show it."""
        return {"client_id": self.client_id, "token": self.token, "scopes": sorted(self.scopes)}


def parse_scopes(values: Iterable[str]) -> frozenset[str]:
    """Known scope names, or `unknown_scope`; at least one is required."""
    scopes = frozenset(value.strip() for value in values if value.strip())
    unknown = sorted(scopes - set(SCOPES))
    if unknown:
        raise InvalidInput("unknown_scope", f"unknown scope {unknown[0]!r}; known: "
                           + ", ".join(SCOPES), extra={"field": "scopes"})
    if not scopes:
        raise InvalidInput("validation_error", "at least one scope is required",
                           extra={"field": "scopes"})
    return scopes


def _scope_text(scopes: Iterable[str]) -> str:
    return " ".join(sorted(scopes))


def _scope_set(text: str) -> frozenset[str]:
    return frozenset(text.split())


def create_pairing_code(
    db: Database, *, scopes: frozenset[str], ttl_seconds: float, name: str | None = None
) -> IssuedCode:
    """A one-time code that a new client redeems for a token within `ttl_seconds`."""
    code_id = random_id("pc")
    secret = new_secret(16)
    with db.write() as conn:
        now = db.clock.now_ms()
        expires_at = now + int(ttl_seconds * 1000)
        conn.execute(insert(pairing_codes).values(
            id=code_id, secret_hash=hash_secret(secret), scopes=_scope_text(scopes), name=name,
            created_at=now, expires_at=expires_at, failures=0,
        ))
    return IssuedCode(f"{code_id}-{secret}", expires_at, scopes)


def redeem_pairing_code(db: Database, code: str, name: str | None = None) -> IssuedToken:
    """Exchange a valid code for a new client and its token; the code is then spent.

    Unknown, expired, used and burnt codes all fail alike (`invalid_pairing_code`), so a
    guesser learns nothing. A wrong secret for a known code is counted in the same
    transaction that decides, and the count is committed even though the call fails.
    """
    match = _CODE.match(code)
    if match is not None:
        code_id, secret = match.groups()
        with db.write() as conn:
            now = db.clock.now_ms()
            row = conn.execute(select(pairing_codes).where(pairing_codes.c.id == code_id)).first()
            if row is not None and same_secret(secret, row.secret_hash):
                spent = conn.execute(
                    update(pairing_codes)
                    .where(pairing_codes.c.id == code_id, pairing_codes.c.used_at.is_(None),
                           pairing_codes.c.failures < MAX_PAIRING_FAILURES,
                           pairing_codes.c.expires_at > now)
                    .values(used_at=now)
                ).rowcount
                if spent:
                    return _insert_client(conn, name or row.name or DEFAULT_CLIENT_NAME,
                                          _scope_set(row.scopes), now)
            elif row is not None:
                conn.execute(update(pairing_codes).where(pairing_codes.c.id == code_id)
                             .values(failures=pairing_codes.c.failures + 1))
    raise Unauthorized("invalid_pairing_code",
                       "the pairing code is unknown, expired, already used or burnt")


def create_client(db: Database, *, name: str, scopes: frozenset[str]) -> IssuedToken:
    """A client created directly by an operator (`taskward pair --token`)."""
    with db.write() as conn:
        return _insert_client(conn, name, scopes, db.clock.now_ms())


def _insert_client(conn: Connection, name: str, scopes: frozenset[str], now: int) -> IssuedToken:
    client_id = sortable_id("cli", now)
    token = new_token()
    conn.execute(insert(clients).values(
        id=client_id, name=name, token_hash=hash_secret(token), scopes=_scope_text(scopes),
        created_at=now, revoked_at=None,
    ))
    return IssuedToken(client_id, token, scopes)


# Built once: authentication runs on every request, and building the statement anew
# costs as much as executing it.
_CLIENT_BY_TOKEN_HASH = select(
    clients.c.id, clients.c.name, clients.c.scopes, clients.c.token_hash, clients.c.revoked_at
).where(clients.c.token_hash == bindparam("token_hash"))


def authenticate(conn: Connection, token: str) -> Client:
    """The active client holding `token`, or `invalid_token` (unknown or revoked)."""
    row = conn.execute(_CLIENT_BY_TOKEN_HASH, {"token_hash": hash_secret(token)}).first()
    if row is None or row.revoked_at is not None or not same_secret(token, row.token_hash):
        raise Unauthorized("invalid_token", "the bearer token is unknown or revoked")
    return Client(row.id, row.name, _scope_set(row.scopes))


Revocations = tuple[int, int]


def revocations(conn: Connection) -> Revocations:
    """A marker that grows whenever a client is revoked: (how many are, the latest time).

    Processes that cache authenticated tokens re-read it to learn that their cache may
    hold a revoked client; clients are never un-revoked, so it never goes back.
    """
    row = conn.execute(_REVOCATIONS).one()
    return (row.revoked, row.latest or 0)


_REVOCATIONS = select(func.count(clients.c.revoked_at).label("revoked"),
                      func.max(clients.c.revoked_at).label("latest"))


def list_clients(conn: Connection) -> list[Row[Any]]:
    return list(conn.execute(select(clients).order_by(clients.c.id)))


def revoke(db: Database, client_id: str) -> None:
    """Revoke a client's token for good; revoking twice is fine, an unknown id is not."""
    with db.write() as conn:
        conn.execute(update(clients)
                     .where(clients.c.id == client_id, clients.c.revoked_at.is_(None))
                     .values(revoked_at=db.clock.now_ms()))
        if conn.execute(select(clients.c.id).where(clients.c.id == client_id)).first() is None:
            raise NotFound("client_not_found", "no such client")


def first_start_admin_code(db: Database, settings: Settings) -> str | None:
    """A fresh admin pairing code when no active admin client exists, else None.

    `taskward run` prints it at start-up, so a new installation can be taken over
    by whoever reads the console, and an installed one gives nothing away.
    """
    with db.read() as conn:
        active = conn.execute(select(clients.c.scopes).where(clients.c.revoked_at.is_(None)))
        if any(ADMIN in _scope_set(row.scopes) for row in active):
            return None
    return create_pairing_code(db, scopes=frozenset({ADMIN}), name="admin",
                               ttl_seconds=settings.pairing_code_ttl_seconds).code


def client_object(row: Row[Any]) -> dict[str, Any]:
    return {
        "id": row.id,
        "object": "client",
        "name": row.name,
        "scopes": sorted(_scope_set(row.scopes)),
        "created_at": iso(row.created_at),
        "revoked_at": iso(row.revoked_at),
    }
