"""Task creation on PostgreSQL in ONE statement: the model check, the tasks, their
response rows and their `response.created` events.

`insert_tasks` is four statements, and on PostgreSQL each is a round trip to the
server: measured under load, the round trips, not the work, bounded `POST
/v1/responses`. Here the tasks go in as one `INSERT … SELECT FROM json_to_recordset`
guarded by the model check, and the response rows and first events are inserted by
data-modifying CTEs from the rows that insert returned, so a dedupe conflict skips
all three rows of its task exactly as before. Same transaction, same rows, same
outcome per request: one round trip instead of four (five with the NOTIFY that
announces the work, which rides along too). SQLite (no data-modifying CTEs,
and no round trips) keeps the four statements.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Integer,
    String,
    Text,
    bindparam,
    func,
    insert,
    literal,
    select,
)
from sqlalchemy.dialects import postgresql

from core.store.bulk import json_rows, rows_param
from core.store.database import WORK_CHANNEL
from core.tables import models, responses, task_events, tasks


def born_at_once(
    conn: Connection, rows: Sequence[Mapping[str, Any]], wanted_models: Sequence[str], now: int,
    *, notify: bool,
) -> tuple[bool, set[str]]:
    """Insert the tasks `rows` (all with the same keys) with their response rows and
    first events; `(every model known, ids of the tasks inserted)`. Nothing is inserted
    when a model is unknown; a task whose dedupe key is held is skipped. `notify`: the
    same statement NOTIFYs `WORK_CHANNEL` (`Database.announce_work(notified=True)`)."""
    statement = _statement(tuple(rows[0]), notify)
    # One order of dedupe keys for every batch: batches in flight side by side then
    # wait for each other's keys in one direction only, never in a deadlock (stable,
    # so the first request of a batch holding a key still wins it).
    ordered = sorted(rows, key=lambda row: (row["client_id"], row["dedupe_key"] or ""))
    answer = conn.execute(statement, {"rows": rows_param(ordered), "models": list(wanted_models),
                                      "wanted": len(wanted_models), "now": now}).one()
    return answer.known == len(wanted_models), set(answer.ids or ())


@cache
def _statement(keys: tuple[str, ...], notify: bool) -> Any:
    given = json_rows("postgresql", "rows", [(key, tasks.c[key].type) for key in keys])
    known = (select(func.count()).select_from(models)
             .where(models.c.id.in_(bindparam("models", expanding=True)))
             .scalar_subquery())
    born = (postgresql.insert(tasks)
            .from_select([tasks.c[key] for key in keys],
                         select(*given.c).where(known == bindparam("wanted", type_=Integer)))
            .on_conflict_do_nothing()
            .returning(tasks.c.id)
            .cte("born"))
    now = bindparam("now", type_=BigInteger)
    answers = insert(responses).from_select(
        [responses.c.task_id, responses.c.output_text, responses.c.updated_at],
        select(born.c.id, literal("", Text), now)).cte("answers")
    created = insert(task_events).from_select(
        [task_events.c.task_id, task_events.c.seq, task_events.c.type,
         task_events.c.created_at, task_events.c.data],
        select(born.c.id, literal(1, Integer), literal("response.created", String),
               now, literal("{}", Text))).cte("created")
    columns: list[Any] = [known.label("known"),
               select(func.array_agg(born.c.id)).scalar_subquery().label("ids")]
    if notify:
        columns.append(func.pg_notify(literal(WORK_CHANNEL, String), literal("", String)))
    return select(*columns).add_cte(answers, created)
