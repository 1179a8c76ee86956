"""Task creation on PostgreSQL in ONE statement: the model check, the tasks, their
response rows and their `response.created` events.

`insert_tasks` is four statements, and on PostgreSQL each is a round trip to the
server: measured under load, the round trips, not the work, bounded `POST
/v1/responses`. Here the tasks go in as one `INSERT … SELECT FROM json_to_recordset`
guarded by the model check, and the response rows and first events are inserted by
data-modifying CTEs from the rows that insert returned, so a dedupe conflict skips
all three rows of its task exactly as before. The due tasks' places in the fair line
are found in the same statement: `core.store.line.places` asks two queries per
(client, priority), each a round trip, and here the same two index probes are
subqueries of the insert, which adds to each the offset of its task among that
(client, priority)'s tasks of the batch (`line_offsets`). Same transaction, same rows,
same places, same outcome per request: one round trip instead of six (seven with
the NOTIFY that announces the work, which rides along too). It runs on the driver's
cursor (`core.store.driver`), and a batch that is nothing but this statement runs it
as a transaction of its own: one round trip, no BEGIN or COMMIT. SQLite (no
data-modifying CTEs, and no round trips) keeps its statements
(`core.store.sqlite_births`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Integer,
    String,
    Text,
    bindparam,
    case,
    cast,
    func,
    insert,
    literal_column,
    select,
)
from sqlalchemy.engine import Dialect

from core.store import birth_event
from core.store.bulk import dialect_module, json_rows, rows_param
from core.store.database import WORK_CHANNEL
from core.store.driver import driver_text
from core.tables import IS_IN_LINE, idempotency_keys, models, responses, task_events, tasks


def line_offsets(joining: Sequence[tuple[str, int]]) -> list[int]:
    """For each (client id, priority) joining the line, in order, how many of the same
    pair joined before it in this batch: `core.store.line.places` gives the first of a
    pair its place and each next one the round after."""
    seen: dict[tuple[str, int], int] = {}
    offsets = []
    for key in joining:
        offsets.append(seen.get(key, 0))
        seen[key] = offsets[-1] + 1
    return offsets


def births_query(
    dialect: Dialect, rows: Sequence[Mapping[str, Any]], wanted_models: Sequence[str],
    now: int, *, notify: bool, records: Sequence[Mapping[str, Any]] = (),
) -> tuple[str, dict[str, Any]]:
    """The statement inserting the tasks `rows` (all with the same keys) with their
    response rows and first events, as text and parameters for a driver cursor
    (`core.store.driver`, or asyncio's in `core.store.pg_async`): in a transaction, or
    committing by itself. A row's `vtime` is its `line_offsets` offset if it is due,
    else None (it waits outside the line). Nothing is inserted when a model is
    unknown; a task whose dedupe key is held is skipped. `notify`: the same statement
    NOTIFYs `WORK_CHANNEL` (`Database.announce_work(notified=True)`).

    `records`: idempotency records (rows of `idempotency_keys`, each naming one of
    `rows` by `task_id`), stored first with `ON CONFLICT DO NOTHING`; a task whose
    record was refused (its key already recorded, or being recorded by a transaction
    not yet committed, which this waits for) is not inserted, so of two requests with
    one key exactly one creates a task. Not for a row that also has a dedupe key: a
    dedupe conflict would skip the task and keep its record."""
    text = _driver_statement(tuple(rows[0]), notify, bool(records), dialect)
    # One order of dedupe keys for every batch: batches in flight side by side then
    # wait for each other's keys in one direction only, never in a deadlock (stable,
    # so the first request of a batch holding a key still wins it). Idempotency keys
    # likewise, and all of them before any dedupe key (`_statement`).
    ordered = sorted(rows, key=lambda row: (row["client_id"], row["dedupe_key"] or ""))
    params = {"rows": rows_param(ordered), "models": json.dumps(list(wanted_models)),
              "now": now}
    if records:
        params["records"] = rows_param(sorted(
            records, key=lambda record: (record["client_id"], record["key"])))
    return text, params


def births_answer(
    row: Sequence[Any], wanted_models: Sequence[str]
) -> tuple[bool, dict[str, int | None]]:
    """`(every model known, place in the line of each task inserted by id)`, from the
    row `births_query`'s statement returned."""
    known, places = row[:2]
    return known == len(wanted_models), dict(places or {})


@cache
def _driver_statement(keys: tuple[str, ...], notify: bool, keyed: bool,
                      dialect: Dialect) -> str:
    variables = {"rows": "[]", "models": "[]", "now": 0, **({"records": "[]"} if keyed else {})}
    text, constants = driver_text(_statement(keys, notify, keyed), dialect, variables)
    assert not constants  # what does not change is in the text, not a parameter to adapt
    return text


@cache
def _statement(keys: tuple[str, ...], notify: bool, keyed: bool) -> Any:
    """Three parameters (four with idempotency records), all JSON text but one: psycopg
    adapts a string or an integer for a fraction of what a list (an array) or each
    constant bound apart costs it, and every batch pays that adaptation."""
    given = json_rows("postgresql", "rows", [(key, tasks.c[key].type) for key in keys])
    wanted = cast(bindparam("models", type_=Text), JSON)
    named = select(func.json_array_elements_text(wanted).table_valued("value").c.value)
    known = (select(func.count()).select_from(models).where(models.c.id.in_(named))
             .scalar_subquery())
    admitted = [known == func.json_array_length(wanted)]
    ctes = []
    if keyed:
        given_records = json_rows("postgresql", "records", [
            (column.key, column.type) for column in idempotency_keys.c])
        recorded = (dialect_module("postgresql").insert(idempotency_keys)
                    .from_select(list(idempotency_keys.c),
                                 select(*given_records.c).where(*admitted))
                    .on_conflict_do_nothing()
                    .returning(idempotency_keys.c.task_id)
                    .cte("recorded"))
        # Not `IN recorded`: EXCEPT reads every record (so stores every key, in their
        # order) before the first task goes in.
        refused = select(given_records.c.task_id).except_(select(recorded.c.task_id))
        admitted.append(given.c.id.not_in(refused))
        ctes.append(recorded)
    values = [_placed(given) if key == "vtime" else given.c[key] for key in keys]
    born = (dialect_module("postgresql").insert(tasks)
            .from_select([tasks.c[key] for key in keys], select(*values).where(*admitted))
            .on_conflict_do_nothing()
            .returning(tasks.c.id, tasks.c.vtime)
            .cte("born"))
    now = bindparam("now", type_=BigInteger)
    answers = insert(responses).from_select(
        [responses.c.task_id, responses.c.output_text, responses.c.updated_at],
        select(born.c.id, _constant("''", Text), now)).cte("answers")
    created = insert(task_events).from_select(
        [task_events.c.task_id, task_events.c.seq, task_events.c.type,
         task_events.c.created_at, task_events.c.data],
        select(born.c.id, _constant(str(birth_event.SEQ), Integer),
               _constant(f"'{birth_event.TYPE}'", String), now,
               _constant(f"'{birth_event.DATA}'", Text))).cte("created")
    places = select(func.json_object_agg(born.c.id, born.c.vtime, type_=JSON))
    columns: list[Any] = [known.label("known"), places.scalar_subquery().label("places")]
    if notify:
        columns.append(func.pg_notify(_constant(f"'{WORK_CHANNEL}'", String),
                                      _constant("''", String)))
    return select(*columns).add_cte(*ctes, answers, created)


def _constant(sql: str, kind: Any) -> Any:
    """A constant written into the statement's text (SQLAlchemy binds a Python
    literal as one more parameter)."""
    return literal_column(sql, kind)


def _placed(given: Any) -> Any:
    """A due row's place: `core.store.line.places`' rule (the round served now at its
    priority, or the round after its client's last one in line there if that is later)
    plus its offset in the batch; a row that is not due stays outside the line."""
    now_serving = func.coalesce(
        select(func.min(tasks.c.vtime))
        .where(IS_IN_LINE, tasks.c.priority == given.c.priority).scalar_subquery(),
        _constant("0", BigInteger))
    last_round = (select(func.max(tasks.c.vtime))
                  .where(IS_IN_LINE, tasks.c.client_id == given.c.client_id,
                         tasks.c.priority == given.c.priority).scalar_subquery())
    first = func.greatest(now_serving,
                          func.coalesce(last_round + _constant("1", BigInteger), now_serving))
    return case((given.c.vtime.is_(None), None), else_=first + given.c.vtime)
