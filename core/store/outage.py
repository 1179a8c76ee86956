"""Which store errors are an outage: the store is down or unreachable, ended the
session under the caller, or takes no writes for now. Each passes by itself or by an
operator's hand, so the API answers it `503 store_unavailable` and the CLI tells the
operator to check the store, where any other error is a fault of taskward's own."""

from __future__ import annotations

from sqlalchemy.exc import DBAPIError, OperationalError

# PostgreSQL's read_only_sql_transaction: a server that takes no writes until someone
# changes that (a standby reached after a failover, `default_transaction_read_only` set
# by an operator, or by a managed service whose storage is nearly full). psycopg raises
# it as an `InternalError`. Reads still work.
_READ_ONLY = "25006"
# PostgreSQL's insufficient_privilege on a store table: a role granted SELECT alone (or
# nothing) on taskward's tables. Like a read-only server it is mended by an operator
# (a GRANT), not by a change of taskward's; psycopg raises it as a `ProgrammingError`.
_INSUFFICIENT_PRIVILEGE = "42501"
_REFUSALS = (_READ_ONLY, _INSUFFICIENT_PRIVILEGE)
# PostgreSQL's errors that end the session rather than the statement: a connection
# exception (class 08) and the server ending its sessions (admin_shutdown, by
# `pg_terminate_backend` too; crash_shutdown; cannot_connect_now).
_CONNECTION_EXCEPTION = "08"
_SESSION_ENDED = ("57P01", "57P02", "57P03")
_CAUSES_LOOKED_AT = 8  # chains are short; a cycle of causes must not loop for ever


def is_store_outage(exc: BaseException) -> bool:
    """The driver's `OperationalError` (a refused or lost connection, a full disk, a
    locked SQLite file), any driver error after which SQLAlchemy dropped the connection
    (PostgreSQL ending a transaction left idle past its bound is an `InternalError`), or
    a refused write or read (`_READ_ONLY`, `_INSUFFICIENT_PRIVILEGE`)."""
    return isinstance(exc, OperationalError) or (
        isinstance(exc, DBAPIError) and (
            exc.connection_invalidated or getattr(exc.orig, "sqlstate", None) in _REFUSALS))


def is_connection_lost(exc: BaseException) -> bool:
    """Whether `exc` is a store call's connection ending under it (an administrator's
    `pg_terminate_backend`, a pooler's or the server's restart, the network), after
    which a fresh connection may well work at once: SQLAlchemy saw the connection go
    (`connection_invalidated`), or the driver's `OperationalError` says so itself, as a
    statement on the driver's own cursor raises it (`core.store.driver`: SQLAlchemy
    does not look at the connection then). psycopg gives libpq's own failures (a
    connection lost or refused) no SQLSTATE; sqlite3 gives none of its errors one, and
    a SQLite file has no session to lose, so none of them is."""
    if not isinstance(exc, DBAPIError):
        return False
    if exc.connection_invalidated:
        return True
    if not isinstance(exc, OperationalError) or not hasattr(exc.orig, "sqlstate"):
        return False
    sqlstate: str | None = getattr(exc.orig, "sqlstate")
    return sqlstate is None or sqlstate.startswith(_CONNECTION_EXCEPTION) or (
        sqlstate in _SESSION_ENDED)


def is_privilege_refused(exc: BaseException) -> bool:
    """Whether `exc` is PostgreSQL refusing this role a store table (`42501`): the one
    outage whose next step is a GRANT, not a check of the server."""
    return (isinstance(exc, DBAPIError)
            and getattr(exc.orig, "sqlstate", None) == _INSUFFICIENT_PRIVILEGE)


def outage_behind(exc: BaseException) -> BaseException | None:
    """`exc` when it is an outage, or the error it was raised from (`__cause__`, as a
    group write's failure carries its write's error) when that is; else None."""
    seen: BaseException | None = exc
    for _ in range(_CAUSES_LOOKED_AT):
        if seen is None or is_store_outage(seen):
            return seen
        seen = seen.__cause__
    return None
