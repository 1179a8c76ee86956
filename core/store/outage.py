"""Which store errors are an outage: the store is down or unreachable, ended the
session under the caller, or takes no writes for now. Each passes by itself or by an
operator's hand, so the API answers it `503 store_unavailable` and the CLI tells the
operator to check the store, where any other error is a fault of taskward's own; and
what may be logged of one (`outage_cause`), so the API's 503 line tells a full server
from a down one."""

from __future__ import annotations

import re

from sqlalchemy.exc import DBAPIError, OperationalError

from core.error_chain import error_chain

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
# What the role of TASKWARD_DATABASE_URL must be granted on taskward's tables, as a
# GRANT spells it: the one next step of a refused privilege, named alike by `/readyz`
# and by the CLI's line.
TABLE_PRIVILEGES = "SELECT, INSERT, UPDATE, DELETE"
# PostgreSQL's errors that end the session rather than the statement: a connection
# exception (class 08) and the server ending its sessions (admin_shutdown, by
# `pg_terminate_backend` too; crash_shutdown; cannot_connect_now).
_CONNECTION_EXCEPTION = "08"
_SESSION_ENDED = ("57P01", "57P02", "57P03")
# PostgreSQL's lock_not_available: a statement waited past `lock_timeout` for a row (or
# a table) another transaction holds: an operator's `SELECT ... FOR UPDATE`, a long
# migration. Nothing is down, and only what that transaction holds is out of reach.
_LOCK_NOT_AVAILABLE = "55P03"

# What an outage's SQLSTATE is logged with: PostgreSQL's condition, in fixed words,
# for the codes an outage has; any other code by its class (its first two characters).
# The driver's message is never logged: it may quote a statement's data.
_CONDITIONS = {
    "08006": "connection failure", _READ_ONLY: "read-only transaction",
    "25P03": "idle-in-transaction session timeout",
    _LOCK_NOT_AVAILABLE: "lock not available, held by another transaction",
    _INSUFFICIENT_PRIVILEGE: "insufficient privilege",
    "53100": "disk full", "53200": "out of memory", "53300": "too many connections",
    "57014": "statement cancelled", "57P01": "session ended by an administrator",
    "57P02": "server crashed", "57P03": "server not accepting connections yet",
}
_CONDITION_CLASSES = {
    "08": "connection exception", "25": "invalid transaction state",
    "28": "authentication refused", "3D": "no such database", "40": "transaction rollback",
    "42": "access rule violation", "53": "insufficient resources",
    "55": "object not in prerequisite state", "57": "operator intervention",
    "58": "system error", "XX": "internal error",
}
# A refused connection carries no SQLSTATE (libpq keeps only the server's message):
# these words of the server's (English) refusal tell the code, and nothing else of the
# message is used.
_REFUSALS_BY_WORDS = (("too many", "53300"), ("starting up", "57P03"),
                      ("shutting down", "57P03"), ("recovery mode", "57P03"),
                      ("not yet accepting", "57P03"))
_SQLSTATE = re.compile(r"[0-9A-Z]{5}")
_CONNECT_FAILED = "connection failed:"  # how psycopg's message for a failed connect begins


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


def is_connection_dropped(exc: BaseException) -> bool:
    """Whether `exc` is a session that was made and then ended under the call
    (`is_connection_lost`), not a connection that could not be made. A loop whose last
    call went through says so in one line (`drop_cause`) and calls again at once on a
    fresh connection: an administrator's `pg_terminate_backend` or a pooler's restart
    is over by then. Only if that call fails too is it an outage, logged as one."""
    return is_connection_lost(exc) and not (
        isinstance(exc, DBAPIError) and str(exc.orig).startswith(_CONNECT_FAILED))


def drop_cause(exc: BaseException) -> str:
    """What a log line says of a dropped connection `exc`: the SQLSTATE the server
    ended the session with, in fixed words (`outage_cause`), read off the driver's error
    or the one it was raised while handling (psycopg's "the connection is lost", raised
    by the rollback after the server's `57P01`, has none of its own); else that none
    came, as when the server's last words were not read before its socket closed."""
    driver_error = exc.orig if isinstance(exc, DBAPIError) else exc
    coded = next((seen for seen in error_chain(driver_error)
                  if getattr(seen, "sqlstate", None)), None)
    return outage_cause(coded) if coded is not None else (
        "no SQLSTATE, the server or the network closed it")


def drop_said(who: str, again: str, exc: BaseException) -> str:
    """The one line a loop logs when the store dropped its connection under it and it
    does `again` at once (`is_connection_dropped`): the claimer, the LISTEN thread and
    the maintenance pass say it alike, so an operator greps one phrase."""
    return (f"{who}: the store dropped the connection: {drop_cause(exc)}; {again} at once "
            "on a fresh one")


def is_privilege_refused(exc: BaseException) -> bool:
    """Whether `exc` is PostgreSQL refusing this role a store table (`42501`): the one
    outage whose next step is a GRANT, not a check of the server."""
    return (isinstance(exc, DBAPIError)
            and getattr(exc.orig, "sqlstate", None) == _INSUFFICIENT_PRIVILEGE)


def is_row_held(exc: BaseException) -> bool:
    """Whether `exc` is a statement that gave up waiting for a row (or a table) another
    transaction holds (`_LOCK_NOT_AVAILABLE`, past `lock_timeout`). psycopg raises it
    as an `OperationalError`, so an API request meeting one is answered `503
    store_unavailable` (try again: the hold passes); a worker tells it apart, as a
    held row and not a store that is down (`outage_behind`)."""
    return (isinstance(exc, DBAPIError)
            and getattr(exc.orig, "sqlstate", None) == _LOCK_NOT_AVAILABLE)


def outage_behind(exc: BaseException) -> BaseException | None:
    """`exc` when it is an outage, or the error it was raised from (`__cause__`, as a
    group write's failure carries its write's error) when that is; else None. Not an
    error it was raised while handling: a bug met while handling an outage keeps its
    traceback. Nor a held row (`is_row_held`): the store is up, and the line that says
    it is unavailable sent an operator to check a server that was fine."""
    return next((seen for seen in error_chain(exc, handled=False)
                 if is_store_outage(seen) and not is_row_held(seen)), None)


def outage_cause(cause: BaseException) -> str:
    """What may be logged of a driver's error beside its class, so that a server that
    refuses connections (too many) is told from one that is down, and a session an
    administrator ended from a lost network: PostgreSQL's SQLSTATE and its condition
    in fixed words, SQLite's result code name; "" for nothing more to say. The driver's
    message is never quoted: it may hold a statement's data."""
    sqlite_code = getattr(cause, "sqlite_errorname", None)
    if isinstance(sqlite_code, str):
        return sqlite_code
    sqlstate = getattr(cause, "sqlstate", None)
    if isinstance(sqlstate, str) and _SQLSTATE.fullmatch(sqlstate):
        condition = _CONDITIONS.get(sqlstate) or _CONDITION_CLASSES.get(sqlstate[:2], "")
        return f"SQLSTATE {sqlstate}" + (f" ({condition})" if condition else "")
    message = str(cause)
    if not message.startswith(_CONNECT_FAILED):
        return ""
    if "FATAL:" not in message:
        return "could not connect to the server"
    found = next((code for words, code in _REFUSALS_BY_WORDS if words in message), None)
    return ("the server refused the connection" +
            (f": SQLSTATE {found} ({_CONDITIONS[found]})" if found else ""))
