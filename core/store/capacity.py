"""Fleet-wide concurrency of upstream models, enforced inside the claim transaction.

An upstream entry's `max_concurrency` bounds its attempts in flight (leased, lease not
yet expired) across every sweeper on every machine. The claim counts them and takes
only what fits, in the same transaction, serialised on the model: on PostgreSQL the
claim locks the model rows (`SELECT … FOR UPDATE`, in id order, so two claimers never
deadlock) before it counts, and READ COMMITTED gives that count a snapshot taken after
the other claimer committed; on SQLite the claim holds the database's one writer lock.
An attempt whose lease ran out is not counted: its worker has stopped (it fences
itself), and a resumable task must not be kept from its own continuation.
A claim also takes no more of a model than the claiming process asks (its caps, from
`Router.claim_caps`): none while its upstream is cooling down there, one for a probe.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from sqlalchemy import Connection, Row, bindparam, func, select

from core.tables import IS_LEASED, models, tasks

NO_CAPS: Mapping[str, int] = MappingProxyType({})
"""No model capped (`with_room`, `admit`): each takes what its bound leaves room for."""

_LIMITS = select(models.c.id, models.c.max_concurrency).where(
    models.c.max_concurrency.is_not(None))
_IN_FLIGHT = (select(tasks.c.model, func.count().label("n"))
              .where(IS_LEASED, tasks.c.model.in_(bindparam("p_models", expanding=True)),
                     tasks.c.lease_expires_at > bindparam("p_now"))
              .group_by(tasks.c.model))
_LOCK = (select(models.c.id).where(models.c.id.in_(bindparam("p_models", expanding=True)))
         .order_by(models.c.id).with_for_update())


def upstream_limits(conn: Connection) -> dict[str, int]:
    """`max_concurrency` of every upstream entry (a handful of rows)."""
    return {row.id: row.max_concurrency for row in conn.execute(_LIMITS)}


def in_flight(conn: Connection, model_ids: Sequence[str], now: int) -> Counter[str]:
    """Attempts in flight per model, read through the leased-tasks index."""
    if not model_ids:
        return Counter()
    rows = conn.execute(_IN_FLIGHT, {"p_models": list(model_ids), "p_now": now})
    return Counter({row.model: row.n for row in rows})


def with_room(
    limits: dict[str, int], counts: Counter[str], caps: Mapping[str, int] = NO_CAPS
) -> list[str]:
    """The upstream models below their bound by `counts` (`in_flight`, read unlocked),
    but for those the claiming process cannot start now (a cap of 0 in `caps`: every
    URL cooling down there, so an attempt would send nothing): which ones a claim looks
    at. `admit` decides."""
    return sorted(m for m, bound in limits.items()
                  if counts[m] < bound and caps.get(m) != 0)


def admit(
    conn: Connection, candidates: Sequence[Row[Any]], limits: dict[str, int], now: int,
    *, counted: Counter[str] | None = None, caps: Mapping[str, int] = NO_CAPS,
) -> list[Row[Any]]:
    """The candidates (in claim order) that fit their models' bounds, counted after
    locking the models' rows; or by `counted`, the counts this transaction made before,
    when no other claim can have changed them since (SQLite: the claim has held the one
    writer lock since it began), so nothing is locked or counted again. A model capped
    in `caps` (`Router.claim_caps`: the claiming process would only hand the rest back)
    gets no more than its cap. A candidate whose attempts are spent needs no room: the
    claim dead-letters it."""
    wanted = sorted({c.model for c in candidates})
    if not wanted:
        return []
    if counted is None:
        conn.execute(_LOCK, {"p_models": wanted})
        counted = in_flight(conn, wanted, now)
    room = {m: limits.get(m, 0) - counted[m] for m in wanted}
    for m in room.keys() & caps.keys():
        room[m] = min(room[m], caps[m])
    admitted = []
    for candidate in candidates:
        if candidate.attempts >= candidate.max_attempts:
            admitted.append(candidate)
        elif room[candidate.model] > 0:
            room[candidate.model] -= 1
            admitted.append(candidate)
    return admitted
