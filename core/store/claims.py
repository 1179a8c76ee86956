"""Claiming due work: the step that makes a worker the owner of a task.

A claim takes due `queued` tasks and resumable `running` ones in one short transaction,
with a fresh owner token and lease, and dead-letters those whose attempts are spent.
Every later write of the attempt is fenced by that token (`core.store.worker_writes`).
Tasks of upstream models fill their own slots and only as far as their models' fleet-wide
bounds admit (`core.store.capacity`); all other tasks fill the local engine's slots.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from weakref import WeakKeyDictionary

from sqlalchemy import Connection, Row, bindparam, func, select, update
from sqlalchemy.exc import DBAPIError

from core.engines.base import Usage
from core.errors import CancelRequested, LeaseLost
from core.ids import new_owner_token
from core.states import OnRestart, Status
from core.store import capacity, pg_claims
from core.store.database import Database, logged
from core.store.line import place_due
from core.store.models import ModelEntry, entries
from core.store.outage import is_connection_lost
from core.store.redo_dropped import read_after_drop
from core.store.transitions import (
    Add,
    Event,
    IfNull,
    Locked,
    PerRow,
    dead_letter,
    encoded,
    move,
)
from core.tables import IS_ACTIVE, IS_IN_LINE, IS_LEASED, responses, status_in, task_events, tasks

# Whether the last claim through a `Database` found upstream models registered (before
# the first: assumed so). While none are (or no upstream slot is free), a claim on
# PostgreSQL is the local pool's one statement, committing by itself
# (`core.store.pg_claims.claim_alone`); while some are, it is a transaction, so the
# upstream pool is claimed in the same commit as the local one and nothing claimed can
# be left behind by a later statement's failure. A model registered as upstream
# meanwhile is claimed for by the next claim, or by this one if it took no local task.
_UPSTREAM_MODELS: WeakKeyDictionary[Database, bool] = WeakKeyDictionary()


@dataclass(frozen=True)
class Claim:
    """A task this worker now owns, with what it needs to run or resume it."""

    task_id: str
    owner_token: str
    attempt: int
    resumed: bool
    model: str
    request_json: str
    snapshot_json: str | None
    output_text: str
    usage: Usage
    items_opened: int = 0  # `response.output_item.added` events already in the task's log
    upstream: bool = False  # its model is an upstream entry: it holds an upstream slot
    # Its model's registry entry as the claim's transaction read it (None: no longer
    # registered), for the model check at the task's start (`verified_entry`).
    model_entry: ModelEntry | None = None


def claim(
    db: Database, *, limit: int, lease_ms: int, node_id: str, upstream_limit: int = 0,
    caps: Mapping[str, int] = capacity.NO_CAPS,
) -> list[Claim]:
    """Take up to `limit` due tasks of local models and up to `upstream_limit` of
    upstream models (within their `max_concurrency`, and no more of a model than its
    cap in `caps`: the caller could not start the others now) in one short transaction.

    Resumable `running` tasks (lease expired or cleared) come first, oldest first; then
    queued ones in the fair line's order (priority, then round-robin across clients),
    after the waiting tasks whose time has come have been given their place.
    A task whose attempts are spent is dead-lettered here instead of being claimed.
    Every statement is built once: a claim runs for every few tasks a worker executes.
    On PostgreSQL the local pool is claimed in one statement (`core.store.pg_claims`),
    and the upstream pool, only when upstream models exist, by the statements below;
    while none exist, that one statement is the whole transaction (`_UPSTREAM_MODELS`).
    Each claim carries its model's registry entry, read in this transaction.
    A claim whose connection dropped may have committed, its reply alone lost: what it
    took is handed back (`_hand_back`) before the drop is raised.
    """
    if limit <= 0 and upstream_limit <= 0:
        return []
    owner = new_owner_token()
    try:
        return _take_due(db, owner, limit=limit, lease_ms=lease_ms, node_id=node_id,
                         upstream_limit=upstream_limit, caps=caps)
    except DBAPIError as exc:
        if is_connection_lost(exc):
            _hand_back(db, owner, node_id)
        raise


def _take_due(
    db: Database, owner: str, *, limit: int, lease_ms: int, node_id: str, upstream_limit: int,
    caps: Mapping[str, int],
) -> list[Claim]:
    """`claim`'s work, its tasks taken under `owner` (the one statement's and the
    transaction's alike: when the statement took something, it is the claim)."""
    if db.data_modifying_ctes and not (_UPSTREAM_MODELS.get(db, True) and upstream_limit > 0):
        # The local pool in one statement that is its own transaction. When a waiting
        # task is due it claimed nothing, and the claim below places it first; when it
        # claimed nothing and found upstream models, the claim below takes their tasks.
        now = db.clock.now_ms()
        rows, waiting, upstream_models = pg_claims.claim_alone(
            db, now=now, limit=max(limit, 0), owner=owner, lease_until=now + lease_ms,
            node_id=node_id)
        _UPSTREAM_MODELS[db] = upstream_models
        db.announce_committed_events((), _claim_events(rows, now))
        if not waiting and (rows or not (upstream_models and upstream_limit > 0)):
            return _local(rows, owner)
    with db.write_events() as conn:
        now = db.clock.now_ms()
        local: list[Claim] = []
        resumable: list[Row[Any]] = []
        queued: list[Row[Any]] = []
        # The local pool in one round trip; with no local slot free, that statement
        # still places the waiting tasks now due and tells whether upstream models exist.
        if db.data_modifying_ctes:
            rows, upstream_models = pg_claims.claim_local(
                conn, now=now, limit=max(limit, 0), owner=owner, lease_until=now + lease_ms,
                node_id=node_id)
            _UPSTREAM_MODELS[db] = upstream_models
            logged(conn, _claim_events(rows, now))
            local = _local(rows, owner)
            limits = capacity.upstream_limits(conn) if upstream_models and upstream_limit > 0 \
                else {}
        else:
            place_due(conn, now)
            limits = capacity.upstream_limits(conn)
            resumable, queued = _due(conn, _LOCAL, list(limits), now, limit)
        if upstream_limit > 0 and limits:
            counts = capacity.in_flight(conn, list(limits), now)
            more = _due(conn, _UPSTREAM, capacity.with_room(limits, counts, caps), now,
                        upstream_limit)
            admitted = capacity.admit(conn, [*more[0], *more[1]], limits, now,
                                      counted=counts if db.single_writer else None, caps=caps)
            resumable += [c for c in admitted if c.status == Status.RUNNING]
            queued += [c for c in admitted if c.status != Status.RUNNING]
            # The lease starts after the models' locks were granted: a claim that waited
            # for another claimer's commit is not dated before what it then counted.
            now = db.clock.now_ms()
        # A new attempt starts without the previous one's error: a task that failed once
        # and then completed must not report that failure.
        lease = {"owner_token": owner, "lease_expires_at": now + lease_ms, "node_id": node_id,
                 "attempts": Add(1), "started_at": IfNull(now), "error_code": None,
                 "error_message": None}
        taken = _take(conn, now, resumable, Status.RUNNING, lease)
        taken += _take(conn, now, queued, Status.LOADING, {**lease, "snapshot_json": None})
        restarted = [row.id for row, candidate in taken
                     if row.status == Status.LOADING and candidate.started_at is not None]
        if restarted:
            _reset_output(conn, restarted, now)
        found = entries(conn, (candidate.model for _, candidate in taken))
        return local + [_claim(candidate, row.attempts, owner, candidate.model in limits,
                               found.get(candidate.model)) for row, candidate in taken]


def _hand_back(db: Database, owner: str, node_id: str) -> None:
    """Hand back the tasks a claim whose connection dropped took, if it committed with
    its reply alone lost (a network blip, a pooler's restart): no attempt was started
    for them, and under an owner token nobody holds they would wait out their lease and
    then spend an attempt by their restart policy (`on_restart: fail` ending
    `worker_lost`, a last attempt dead-lettered). Each is released as a graceful stop
    releases it (`worker_writes.release`: the attempt refunded, a `resume` task left
    running without a lease, due at once); a cancel asked meanwhile is honoured. The
    claim's events landed with it, so its log reads: claimed, then handed back. Read on
    a fresh connection after a short pause or a few (`redo_dropped.read_after_drop`);
    a store that stays away leaves them to their leases, as before."""
    # Here, not at the top: not on a sweeper's path to its first claim (issue 15).
    from core.store.worker_writes import finish_cancelled, release

    try:
        held = read_after_drop(
            db, lambda conn: conn.execute(_HELD, {"p_owner": owner, "p_node": node_id}).all())
        # The lost reply took the claim's announcement: this process's streams read the log.
        db.announce_committed_events(row.id for row in held)
        for row in held:
            try:
                release(db, row.id, owner, attempt=row.attempts)
            except CancelRequested:
                finish_cancelled(db, row.id, owner)
            except LeaseLost:
                continue  # its lease ran out meanwhile: lease expiry moved it
    except DBAPIError as exc:
        if not is_connection_lost(exc):
            raise


# The tasks a claim's owner token holds, among its node's (`ix_tasks_node`).
_HELD = select(tasks.c.id, tasks.c.attempts).where(
    IS_ACTIVE, tasks.c.node_id == bindparam("p_node"), tasks.c.owner_token == bindparam("p_owner"))


def _local(rows: list[Any], owner: str) -> list[Claim]:
    """The claims of the local pool's rows (`core.store.pg_claims`), each with its
    model's registry entry brought along."""
    brought = pg_claims.model_entries(rows)
    return [_claim(row, row.attempts, owner, False, brought[row.model]) for row in rows]


def _due(
    conn: Connection, pool: str, models: list[str], now: int, limit: int
) -> tuple[list[Row[Any]], list[Row[Any]]]:
    """Resumable and queued candidates of one pool of slots: tasks of the upstream
    `models` (`_UPSTREAM`), or of every model but those (`_LOCAL`)."""
    if limit <= 0 or (pool == _UPSTREAM and not models):
        return [], []
    resumable = _candidates(conn, _RESUMABLE[pool], now, limit, models)
    return resumable, _candidates(conn, _QUEUED[pool], now, limit - len(resumable), models)


# How many output items earlier attempts opened (a retry opens its message at the next
# index: OpenAI's stream helper refuses a second item at one index). Counted over the
# task's own log by primary key; a first attempt's log holds two events.
_ITEMS_OPENED = (
    select(func.count())
    .select_from(task_events)
    .where(task_events.c.task_id == tasks.c.id,
           task_events.c.type == "response.output_item.added")
    .correlate(tasks)
    .scalar_subquery()
    .label("items_opened")
)


def _candidates_query(*where: Any, order: Sequence[Any], with_output: bool) -> Any:
    """Due tasks of one kind in `order`, locked (`p_now`, `p_limit`); a resumable
    task brings its stored output along, a queued one starts over without it."""
    columns = [tasks.c.id, tasks.c.status, tasks.c.attempts, tasks.c.max_attempts,
               tasks.c.model, tasks.c.request_json, tasks.c.snapshot_json, tasks.c.started_at,
               _ITEMS_OPENED]
    query = select(*columns)
    if with_output:
        query = (select(*columns, responses.c.output_text, responses.c.input_tokens,
                        responses.c.output_tokens)
                 .join(responses, responses.c.task_id == tasks.c.id))
    return (query.where(*where)
            .order_by(*order)
            .limit(bindparam("p_limit"))
            .with_for_update(skip_locked=True, of=tasks))


_LOCAL, _UPSTREAM = "local", "upstream"
_POOLS = {_LOCAL: tasks.c.model.not_in(bindparam("p_models", expanding=True)),
          _UPSTREAM: tasks.c.model.in_(bindparam("p_models", expanding=True))}
# An upstream task handed back because its URLs were cooling down waits for `run_at`
# (`worker_writes.release`); every other resumable task's `run_at` is past already.
_RESUMABLE = {pool: _candidates_query(
    IS_LEASED,
    status_in(Status.RUNNING),
    tasks.c.on_restart == OnRestart.RESUME.value,
    tasks.c.lease_expires_at.is_(None) | (tasks.c.lease_expires_at <= bindparam("p_now")),
    models_term,
    *([tasks.c.run_at <= bindparam("p_now")] if pool == _UPSTREAM else []),
    order=(tasks.c.run_at, tasks.c.id),
    with_output=True,
) for pool, models_term in _POOLS.items()}
# The fair line (`core.store.line`): every task in it is due; `ix_tasks_line` serves it.
_QUEUED = {pool: _candidates_query(IS_IN_LINE, tasks.c.run_at <= bindparam("p_now"),
                                   models_term,
                                   order=(tasks.c.priority, tasks.c.vtime, tasks.c.id),
                                   with_output=False)
           for pool, models_term in _POOLS.items()}


def _candidates(
    conn: Connection, query: Any, now: int, limit: int, models: list[str]
) -> list[Row[Any]]:
    if limit <= 0:
        return []
    return list(conn.execute(query, {"p_now": now, "p_limit": limit, "p_models": models}))


def _take(
    conn: Connection, now: int, candidates: list[Row[Any]], to: Status, values: dict[str, Any],
) -> list[tuple[Row[Any], Row[Any]]]:
    """Claim the candidates whose attempts are left, dead-letter the others; returns
    (moved row, candidate row) pairs."""
    if not candidates:
        return []
    expected = Status(candidates[0].status)
    spent = [c.id for c in candidates if c.attempts >= c.max_attempts]
    if spent:
        dead_letter(conn, now, Locked(tuple(spent)), expected=expected)
    fresh = {c.id: c for c in candidates if c.attempts < c.max_attempts}
    if not fresh:
        return []

    started = PerRow(1, lambda row: [_started(to, row.attempts)])

    moved = move(conn, now=now, expected={expected}, where=Locked(tuple(fresh)), to=to,
                 events=started, values=values)
    by_id = {row.id: row for row in moved}
    return [(by_id[i], c) for i, c in fresh.items() if i in by_id]


def _started(to: Status, attempt: int) -> Event:
    """The event a claim logs for a task it takes: `response.in_progress` when it
    resumes a running one, else `response.loading`, with the attempt's number
    (`core.store.pg_claims`' statement writes the same rows)."""
    return Event("response.in_progress" if to is Status.RUNNING else "response.loading",
                 {"attempt": attempt})


def _claim_events(rows: list[Any], now: int) -> Iterator[dict[str, Any]]:
    """The event rows `core.store.pg_claims`' statement logged for the tasks it took
    (`rows`, as moved: each event is its task's last), named for the claim's
    announcement, so that a stream of this process sends them without reading the log.
    The statement's dead letters are not returned, so not named: their streams see them
    at the live tail's next poll."""
    for row in rows:
        event = _started(Status(row.status), row.attempts)
        yield {"task_id": row.id, "seq": row.last_seq, "type": event.type,
               "created_at": now, "data": encoded(event.data)}


def _claim(
    candidate: Any, attempt: int, owner: str, upstream: bool, entry: ModelEntry | None
) -> Claim:
    resumed = candidate.status == Status.RUNNING
    return Claim(task_id=candidate.id, owner_token=owner, attempt=attempt, resumed=resumed,
                 model=candidate.model, request_json=candidate.request_json,
                 snapshot_json=candidate.snapshot_json if resumed else None,
                 output_text=candidate.output_text if resumed else "",
                 usage=(Usage(candidate.input_tokens, candidate.output_tokens) if resumed
                        else Usage()),
                 items_opened=candidate.items_opened, upstream=upstream, model_entry=entry)


def _reset_output(conn: Connection, ids: Sequence[str], now: int) -> None:
    """A task that starts over starts with empty output and usage.

    Done when a queued task that started before is claimed, so requeue, release and
    recovery (which can touch 100,000 tasks at once) never have to rewrite response
    rows. A task's first claim skips it: an attempt writes output only once claimed,
    and `started_at` is never cleared, so a task never started has its response as it
    was born."""
    conn.execute(_RESET_OUTPUT, {"p_ids": list(ids), "p_now": now})


_RESET_OUTPUT = (
    update(responses)
    .where(responses.c.task_id.in_(bindparam("p_ids", expanding=True)),
           (responses.c.output_text != "") | (responses.c.input_tokens != 0)
           | (responses.c.output_tokens != 0))
    .values(output_text="", input_tokens=0, output_tokens=0, updated_at=bindparam("p_now"))
)
