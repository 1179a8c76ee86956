"""Clients and pairing codes in the store (what they are: `core.clients`).

Only hashes of tokens and pairing secrets are stored; every check that compares a
secret uses `core.ids.same_secret`.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy import (
    Connection,
    Row,
    and_,
    bindparam,
    exists,
    func,
    insert,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.sql.elements import ColumnElement

from core.clients import (
    ADMIN,
    DEFAULT_CLIENT_NAME,
    MAX_PAIRING_FAILURES,
    Client,
    IssuedCode,
    IssuedToken,
    parse_pairing_code,
    require_may_manage,
    scope_set,
    scope_text,
)
from core.errors import NotFound, Unauthorized
from core.ids import hash_secret, new_secret, new_token, random_id, same_secret, sortable_id
from core.quotas import LIMIT_NAMES, Limits, limit_changes
from core.settings import Settings
from core.store.database import Database
from core.store.pages import newest_first
from core.tables import clients, pairing_codes


def create_pairing_code(
    db: Database, *, scopes: frozenset[str], ttl_seconds: float, name: str | None = None,
    limits: Limits = Limits(), created_by: str | None = None,
) -> IssuedCode:
    """A one-time code that a new client redeems for a token within `ttl_seconds`; the
    client gets `limits`. `created_by`: the client asking (None: an operator); the code
    redeems only while that client is not revoked."""
    code_id = random_id("pc")
    secret = new_secret(16)
    with db.write() as conn:
        now = db.clock.now_ms()
        expires_at = now + int(ttl_seconds * 1000)
        conn.execute(insert(pairing_codes).values(
            id=code_id, secret_hash=hash_secret(secret), scopes=scope_text(scopes), name=name,
            created_at=now, expires_at=expires_at, failures=0, **limits.columns(),
            created_by=created_by,
        ))
    return IssuedCode(f"{code_id}-{secret}", expires_at, scopes)


def redeem_pairing_code(db: Database, code: str, name: str | None = None) -> IssuedToken:
    """Exchange a valid code for a new client and its token; the code is then spent.

    Unknown, expired, used and burnt codes, and codes whose maker has been revoked,
    all fail alike (`invalid_pairing_code`), so a guesser learns nothing. A wrong
    secret for a live code is counted in the same transaction that decides, and the
    count is committed even though the call fails.

    Anyone may call this (`POST /v1/pair` needs no token), so a code that is not live
    (no such id, spent, burnt, expired) is refused after a read: only a live one takes
    a write turn, and a flood of made-up codes does not queue on SQLite's write lock.
    The write decides again on what it reads itself, so a code spent in between fails.
    """
    parsed = parse_pairing_code(code)
    if parsed is not None and _is_live(db, parsed[0]):
        code_id, secret = parsed
        with db.write() as conn:
            now = db.clock.now_ms()
            row = conn.execute(select(pairing_codes).where(pairing_codes.c.id == code_id)).first()
            if row is not None and same_secret(secret, row.secret_hash):
                spent = conn.execute(
                    update(pairing_codes)
                    .where(pairing_codes.c.id == code_id, live_codes(now), maker_not_revoked())
                    .values(used_at=now)
                ).rowcount
                if spent:
                    return _insert_client(conn, name or row.name or DEFAULT_CLIENT_NAME,
                                          scope_set(row.scopes), now, _limits(row))
            elif row is not None:
                conn.execute(update(pairing_codes).where(pairing_codes.c.id == code_id)
                             .values(failures=pairing_codes.c.failures + 1))
    raise Unauthorized("invalid_pairing_code",
                       "the pairing code is unknown, expired, already used or burnt")


def _is_live(db: Database, code_id: str) -> bool:
    """The code exists and could still be redeemed (its maker is checked by the write)."""
    with db.read() as conn:
        return conn.execute(select(pairing_codes.c.id).where(
            pairing_codes.c.id == code_id, live_codes(db.clock.now_ms()))).first() is not None


def live_codes(now: int) -> ColumnElement[bool]:
    """Codes not used, not burnt and not expired at `now`: with `maker_not_revoked`,
    those that would redeem, which are the ones listed and revocable
    (`core.store.pairing_codes`)."""
    return and_(pairing_codes.c.used_at.is_(None),
                pairing_codes.c.failures < MAX_PAIRING_FAILURES,
                pairing_codes.c.expires_at > now)


def maker_not_revoked() -> ColumnElement[bool]:
    """The code was made by an operator, or by a client that is still in service: in
    the statement that spends (or lists, or revokes) the code, so a revocation of its
    maker committed first is seen."""
    return or_(pairing_codes.c.created_by.is_(None), exists().where(
        clients.c.id == pairing_codes.c.created_by, clients.c.revoked_at.is_(None)))


def create_client(db: Database, *, name: str, scopes: frozenset[str],
                  limits: Limits = Limits()) -> IssuedToken:
    """A client created directly by an operator (`taskward pair --token`)."""
    with db.write() as conn:
        return _insert_client(conn, name, scopes, db.clock.now_ms(), limits)


def _insert_client(
    conn: Connection, name: str, scopes: frozenset[str], now: int, limits: Limits
) -> IssuedToken:
    client_id = sortable_id("cli", now)
    token = new_token()
    conn.execute(insert(clients).values(
        id=client_id, name=name, token_hash=hash_secret(token), scopes=scope_text(scopes),
        created_at=now, revoked_at=None, **limits.columns(),
    ))
    return IssuedToken(client_id, token, scopes)


# Built once: authentication runs on every request, and building the statement anew
# costs as much as executing it.
_CLIENT_BY_TOKEN_HASH = select(
    clients.c.id, clients.c.name, clients.c.scopes, clients.c.token_hash, clients.c.revoked_at,
    *(clients.c[name] for name in LIMIT_NAMES),
).where(clients.c.token_hash == bindparam("token_hash"))


Revocations = tuple[int, int, int]


def authenticate(db: Database, token: str) -> tuple[Client, Revocations]:
    """The active client holding `token`, or `invalid_token` (unknown or revoked), with
    the `revocations` marker read before it in the same snapshot: a revocation committed
    between the two reads then leaves the caller with the older marker, which its next
    recheck outdates."""
    with db.read() as conn:
        marker = _revocations(conn)
        row = conn.execute(_CLIENT_BY_TOKEN_HASH, {"token_hash": hash_secret(token)}).first()
    if row is None or row.revoked_at is not None or not same_secret(token, row.token_hash):
        raise Unauthorized("invalid_token", "the bearer token is unknown or revoked")
    return Client(row.id, row.name, scope_set(row.scopes), _limits(row)), marker


def _limits(row: Row[Any]) -> Limits:
    return Limits(**{name: getattr(row, name) for name in LIMIT_NAMES})


def revocations(db: Database) -> Revocations:
    """A marker that grows whenever a client is revoked or its limits change: (how many
    are revoked, the latest revocation, the latest change of limits).

    Processes that cache authenticated tokens re-read it to learn that their cache may
    hold a revoked client or old limits; clients are never un-revoked (the count grows
    with each revocation) and each change of limits is stamped later than every one
    before it (`_limits_stamp`), so every revocation and change moves it.
    """
    with db.read() as conn:
        return _revocations(conn)


def _revocations(conn: Connection) -> Revocations:
    row = conn.execute(_REVOCATIONS).one()
    return (row.revoked, row.latest or 0, row.limits or 0)


_REVOCATIONS = select(func.count(clients.c.revoked_at).label("revoked"),
                      func.max(clients.c.revoked_at).label("latest"),
                      func.max(clients.c.limits_changed_at).label("limits"))


def list_clients(db: Database) -> list[Row[Any]]:
    with db.read() as conn:
        return list(conn.execute(select(clients).order_by(clients.c.id)))


def clients_page(
    db: Database, *, limit: int, after: str | None
) -> tuple[list[Row[Any]], str | None]:
    """A page of clients, newest first; the cursor is the last id of the page. For lists
    that show a page at a time, where `list_clients` would read every client."""
    with db.read() as conn:
        return newest_first(conn, select(clients), clients.c.id, limit=limit, after=after)


def client_names(db: Database, client_ids: Collection[str]) -> dict[str, str]:
    """The names of the clients among `client_ids`, by id, in one query by primary key;
    an id that names no client is left out. For pages that show a few tasks' clients."""
    if not client_ids:
        return {}
    query = select(clients.c.id, clients.c.name).where(clients.c.id.in_(set(client_ids)))
    with db.read() as conn:
        return {row.id: row.name for row in conn.execute(query)}


def revoke(db: Database, client_id: str, *, by: Client | None = None) -> None:
    """Revoke a client's token for good; revoking twice is fine, an unknown id is not.
    `by` is the calling client (None: an operator), held to `require_may_manage`."""
    with db.write() as conn:
        target = conn.execute(select(clients.c.scopes).where(clients.c.id == client_id)).first()
        if target is None:
            raise NotFound("client_not_found", "no such client")
        require_may_manage(by, scope_set(target.scopes))
        conn.execute(update(clients)
                     .where(clients.c.id == client_id, clients.c.revoked_at.is_(None))
                     .values(revoked_at=db.clock.now_ms()))


def set_limits(
    db: Database, client_id: str, changes: dict[str, Any], *, by: Client | None = None
) -> Row[Any]:
    """Change some of a client's limits (None: back to the default); the client's row.
    `by` is the calling client (None: an operator), held to `require_may_manage`: a
    `clients:admin` client must not be able to throttle the admin out of its service.
    Limits set to what they already are change nothing: the row is not written and
    not stamped, so no process's token cache is refreshed for a change that is none."""
    columns = limit_changes(changes)
    with db.write() as conn:
        row = conn.execute(select(clients).where(clients.c.id == client_id)).first()
        if row is None:
            raise NotFound("client_not_found", "no such client")
        require_may_manage(by, scope_set(row.scopes))
        if all(getattr(row, name) == value for name, value in columns.items()):
            return row
        conn.execute(update(clients).where(clients.c.id == client_id)
                     .values(**columns, limits_changed_at=_limits_stamp(db, conn)))
        return conn.execute(select(clients).where(clients.c.id == client_id)).one()


# PostgreSQL's transaction-level advisory lock that changes of limits take turns on
# (`_limits_stamp`); SQLite's write lock already makes every write take turns.
_LIMITS_LOCK_KEY = 0x74775F6C696D6974  # "tw_limit"
_LATEST_LIMITS_CHANGE = select(func.max(clients.c.limits_changed_at))


def _limits_stamp(db: Database, conn: Connection) -> int:
    """`limits_changed_at` for a change in this write transaction: now, or one past the
    latest stamp when that is not earlier. The token caches learn of a change only when
    the latest stamp grows (`revocations`); a change stamped by a clock behind another
    node's, or in the same millisecond, must grow it all the same. Changes take turns
    (rare: a lock costs nothing), so two never read the same latest stamp."""
    if not db.single_writer:
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _LIMITS_LOCK_KEY})
    latest = conn.execute(_LATEST_LIMITS_CHANGE).scalar()
    return max(db.clock.now_ms(), (latest or 0) + 1)


def first_start_admin_code(db: Database, settings: Settings) -> str | None:
    """A fresh admin pairing code when no active admin client exists, else None.

    `taskward run` prints it at start-up, so a new installation can be taken over
    by whoever reads the console, and an installed one gives nothing away.
    """
    with db.read() as conn:
        active = conn.execute(select(clients.c.scopes).where(clients.c.revoked_at.is_(None)))
        if any(ADMIN in scope_set(row.scopes) for row in active):
            return None
    return create_pairing_code(db, scopes=frozenset({ADMIN}), name="admin",
                               ttl_seconds=settings.pairing_code_ttl_seconds).code
