"""What taskward's PostgreSQL connections are made with, whoever makes them: the pool
(`core.store.connect`), the listener and the API's batch connections."""

from __future__ import annotations

import math
import select
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.engine import URL

IDLE_IN_TRANSACTION = "idle_in_transaction_session_timeout"
LOCK_WAIT = "lock_timeout"
_FALLBACK_NAME = "fallback_application_name"


def with_bounds(url: URL, wait_seconds: float) -> URL:
    """`url` with libpq's network timeouts, each unless the URL sets it already; all of
    them from `wait_seconds` (`TASKWARD_STORE_WAIT_SECONDS`).

    A PostgreSQL host that vanishes (a failover, a partition dropping packets) answers
    nothing, not even a reset: without the timeouts a connection waits on the kernel,
    ~15 minutes for a write to go unacknowledged and for ever for a reply, and every
    store thread that touches it with it. With them such a connection fails after
    about `wait_seconds` of silence from the host's TCP stack, is dropped from the
    pool, and the next call connects afresh (each connect bounded too). A server that
    is slow but up keeps its connections: its kernel still acknowledges and answers
    keepalives. The listener and the API's own batch connections connect with the
    pool's parameters (`libpq_conninfo`), so they carry the same bounds. The bound on
    idle transactions is set after connecting (`bound_session`).
    """
    wait = max(2, math.ceil(wait_seconds))  # libpq's least connect_timeout is 2 s
    bounds = {
        "connect_timeout": str(wait),
        "keepalives": "1",
        "keepalives_idle": str(max(1, wait // 2)),
        "keepalives_interval": str(max(1, wait // 6)),
        "keepalives_count": "3",
        "tcp_user_timeout": str(wait * 1000),
    }
    return url.update_query_dict({k: v for k, v in bounds.items() if k not in url.query})


def named_for(url: URL, role: str) -> URL:
    """`url` whose connections call themselves `taskward-<role>` (`application_name`,
    what `pg_stat_activity` and the server's log show), so a DBA tells the API's
    sessions from a sweeper's or a CLI command's. It is libpq's
    `fallback_application_name`: an `application_name` of the URL's own, or libpq's
    `PGAPPNAME`, wins."""
    if _FALLBACK_NAME in url.query:
        return url
    return url.update_query_dict({_FALLBACK_NAME: f"taskward-{role}"})


def bound_session(engine: Engine, bounds_ms: Mapping[str, int]) -> None:
    """Set each of `bounds_ms` (a server setting counted in ms, and our bound) on every
    connection the pool makes, unless the URL's `options` name that setting or the
    server's own value for this session is stricter.

    `idle_in_transaction_session_timeout` (`IDLE_IN_TRANSACTION`): a taskward process
    stopped or cut off in the middle of a transaction holds that transaction's row locks
    for as long as the server keeps its session: lease expiry, cancels and every other
    writer of those tasks would wait behind them. The server ends such a session,
    rolling it back; taskward never leaves a transaction idle for long, it only ever
    waits on the store inside one. `lock_timeout` (`LOCK_WAIT`): see
    `core.store.connect.sweeper_lock_wait_ms`.

    Set after connecting, not as a start-up option: an option outranks a DBA's
    `ALTER ROLE/DATABASE ... SET`, and a stricter bound of theirs was loosened. Here
    the server's value is kept when it is non-zero and at most ours; one round trip
    per new connection, whatever is set. Only the pool's connections take them: the
    listener's and the API's batch connections are in autocommit and never hold a
    transaction open."""
    named = _folded_options(engine.url)
    ours = {name: ms for name, ms in bounds_ms.items() if name not in named}
    if not ours:
        return
    bounds = {"names": list(ours), "ms": list(ours.values())}

    @event.listens_for(engine, "connect")
    def _bound(dbapi_connection: Any, _record: Any) -> None:
        was = dbapi_connection.autocommit
        dbapi_connection.autocommit = True  # a SET in a transaction rolled back is undone
        try:
            dbapi_connection.execute(_STRICTER_BOUNDS, bounds)
        finally:
            dbapi_connection.autocommit = was


# One statement for all of them: the server's own values (in ms) and ours compared
# where they live.
_STRICTER_BOUNDS = (
    "SELECT set_config(s.name, ours.ms::text, false) FROM pg_settings AS s "
    "JOIN unnest(%(names)s::text[], %(ms)s::bigint[]) AS ours(name, ms) "
    "ON ours.name = s.name WHERE s.setting::bigint = 0 OR s.setting::bigint > ours.ms")


def _folded_options(url: URL) -> str:
    """The URL's libpq `options` (server settings at start-up), one string, in lower
    case and with `_` for `-`: the server reads a setting's name in any case and with
    either (`-c IDLE-IN-TRANSACTION-SESSION-TIMEOUT=0` names it too), so a name looked
    for in this is found however the operator spelled it."""
    given = url.query.get("options", "")
    joined = given if isinstance(given, str) else " ".join(given)  # named more than once
    return joined.lower().replace("-", "_")


def unknown_options(url: URL) -> list[str]:
    """The keys of `url`'s query that are no libpq connection option (a misspelled
    `connect_timeot`), in order. libpq refuses such a key at every connect, and the
    refusal came out of each command as a driver's traceback; found before the first
    connect, it is a configuration error naming the key (never the URL: it may hold a
    password). Every key of the query is passed on to libpq by SQLAlchemy's psycopg
    dialect."""
    from psycopg import pq  # SQLite processes never load psycopg

    known = {option.keyword.decode() for option in pq.Conninfo.get_defaults()}
    return [key for key in url.query if key not in known]


def libpq_conninfo(engine: Engine) -> str:
    """The libpq connection string the PostgreSQL `engine`'s pool connects with (its
    URL's query too: the bounds above, an operator's `options`), for the connections
    taskward makes without SQLAlchemy (the listener, the API's batch connections).
    The URL rendered back to text would not do: it writes a space as `+`, which libpq
    reads as itself."""
    from psycopg.conninfo import make_conninfo  # SQLite processes never load psycopg

    _, params = engine.dialect.create_connect_args(engine.url)
    params.pop("context", None)  # SQLAlchemy's type adapters, not a connection parameter
    return make_conninfo(**params)


def closed_while_idle(connection: Any) -> bool:
    """Whether the server ended this idle psycopg connection since its last use: a
    restart or failover, `idle_session_timeout`, an administrator's
    `pg_terminate_backend`, a proxy's idle timeout. The next statement on it would fail
    (a `503` for the request that drew it), so whoever is about to use it takes a
    fresh one instead.

    An idle connection that LISTENs to nothing gets nothing from the server unless it
    is being ended (its last words: an error, then end of file), so input waiting on
    the socket is enough to tell, without a round trip: one `poll` of the socket,
    ~0.5 us, where a ping would wait for the server."""
    if connection.closed:
        return True
    waiting = select.poll()
    waiting.register(connection.pgconn.socket, select.POLLIN)
    return bool(waiting.poll(0))
