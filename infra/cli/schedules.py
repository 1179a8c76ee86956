"""`taskward schedules list|add|remove`: recurring work, from the operator's seat.

The same core functions as `/v1/schedules`, so the CLI refuses exactly what the API
refuses. An operator sees every client's schedules; a new one belongs to `--client`,
by default the first admin client (the one `taskward pair --admin` made), and only to
a client that may create schedules itself: its tasks are that client's to see and stop.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import click

from core.bodies import decode_json
from core.clients import ADMIN, Client, scope_set
from core.errors import DomainError
from core.ids import could_be_id
from core.schedules import (
    MAX_CATCH_UP,
    MAX_PAGE,
    SCOPE,
    create_schedule,
    list_schedules,
    schedule_object,
)
from core.store.clients import list_clients
from core.store.database import Database
from core.store.schedules import delete_schedule
from infra.cli.context import JSON_OPTION, emit, store
from infra.cli.option_types import CRON_EXPRESSION, DecimalRange

_COLUMNS = ("id", "cron", "catch_up", "next_run_at", "client_id")


@click.group()
def schedules() -> None:
    """Recurring work: a request run on a cron expression (UTC)."""


def _schedule_id(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """An id as the API's `after` takes it; anything else names no page."""
    if value is not None and not could_be_id(value):
        raise click.BadParameter("not a schedule id")
    return value


@schedules.command("list")
@click.option("--client", "client_id", default=None, help="Only this client's schedules.")
@click.option("--limit", default=MAX_PAGE, show_default=True, type=DecimalRange(1, MAX_PAGE))
@click.option("--after", default=None, metavar="SCHEDULE_ID", callback=_schedule_id,
              help="The page after this schedule (the one named by the previous page).")
@JSON_OPTION
def schedules_list(client_id: str | None, limit: int, after: str | None, as_json: bool) -> None:
    """Newest first. When more follow, the command for the next page goes to standard
    error, so standard output stays the table or the one JSON document."""
    with store() as (_, db):
        rows, cursor = list_schedules(db, client_id, limit=limit, after=after)
    emit([schedule_object(row) for row in rows], as_json=as_json, columns=_COLUMNS)
    if cursor is not None:
        click.echo(f"next page: --after {cursor}", err=True)


@schedules.command("add")
@click.option("--cron", required=True, type=CRON_EXPRESSION,
              help='5 fields in UTC, e.g. "30 7 * * 1-5".')
@click.option("--request", "request_text", default=None, metavar="JSON",
              help="A POST /v1/responses body (without run_at).")
@click.option("--request-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="The same body, read from a file.")
@click.option("--catch-up", default=1, show_default=True, type=DecimalRange(1, MAX_CATCH_UP),
              help="Missed slots fired after downtime (the latest ones).")
@click.option("--client", "client_id", default=None,
              help="The owning client's id (default: the first admin client).")
@JSON_OPTION
def schedules_add(cron: str, request_text: str | None, request_file: Path | None,
                  catch_up: int, client_id: str | None, as_json: bool) -> None:
    """Create a schedule; its first slot is the first one after now."""
    if (request_text is None) == (request_file is None):
        raise click.UsageError("give exactly one of --request and --request-file")
    with store() as (settings, db):
        request = _request_body(request_text, request_file, settings.max_body_bytes)
        owner = _owner(db, client_id)
        row = create_schedule(db, settings, owner,
                              {"cron": cron, "request": request, "catch_up": catch_up})
    emit(schedule_object(row), as_json=as_json)


@schedules.command("remove")
@click.argument("schedule_id")
def schedules_remove(schedule_id: str) -> None:
    """Stop future slots; tasks already created are kept."""
    with store() as (_, db):
        delete_schedule(db, schedule_id, None)
    click.echo(f"removed {schedule_id}")


def _request_body(text: str | None, path: Path | None, limit: int) -> dict[str, Any]:
    """The `--request` text or `--request-file` content decoded as the API decodes a
    body: at most `limit` bytes (TASKWARD_MAX_BODY_BYTES), valid UTF-8 JSON with no
    lone surrogate, nested at most as deep as `core.bodies` allows. What the API
    answers 400 or 413 is a usage error here, in one line, never a traceback."""
    source = "--request" if path is None else "--request-file"
    data = (text or "").encode("utf-8", "surrogateescape") if path is None else (
        _regular_file_head(path, limit + 1, source))
    if len(data) > limit:
        raise click.BadParameter(f"body_too_large: more than TASKWARD_MAX_BODY_BYTES "
                                 f"({limit} bytes)", param_hint=source)
    try:
        body = decode_json(data)
    except DomainError as exc:
        raise click.BadParameter(f"{exc.code}: {exc.message}", param_hint=source) from None
    if not isinstance(body, dict):
        raise click.BadParameter("must be a JSON object", param_hint=source)
    return body


def _regular_file_head(path: Path, size: int, source: str) -> bytes:
    """At most `size` bytes of the regular file at `path`. It is opened without
    blocking and its type checked on the descriptor then read, so a FIFO without a
    writer or a device (`/dev/zero`) is refused rather than waited on or read for ever."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as stream:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise click.BadParameter("not a regular file", param_hint=source)
            return stream.read(size)
    except OSError as exc:
        raise click.BadParameter(f"cannot be read ({type(exc).__name__})",
                                 param_hint=source) from None


def _owner(db: Database, client_id: str | None) -> str:
    """The active client the schedule will belong to (its tasks are that client's). It
    must hold the scope `POST /v1/schedules` requires: a client without it could
    neither see where its tasks come from nor stop them."""
    active = [Client(row.id, row.name, scope_set(row.scopes))
              for row in list_clients(db) if row.revoked_at is None]
    if client_id is not None:
        chosen = next((client for client in active if client.id == client_id), None)
        if chosen is None:
            raise click.ClickException(f"no active client {client_id}: see `taskward clients list`")
        if not chosen.allows(SCOPE):
            raise click.ClickException(
                f"client {client_id} lacks the {SCOPE} scope that owning schedules needs")
        return client_id
    admins = [client.id for client in active if ADMIN in client.scopes]
    if not admins:
        raise click.ClickException(
            "no admin client yet: run `taskward pair --admin`, or pass --client")
    return admins[0]


COMMANDS: list[click.Command] = [schedules]
