"""Client commands: pair, pairing-codes, clients; on the store directly, and printing,
as the other operator commands do (`infra.cli.operator` says how)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click

from core.clients import (
    ADMIN,
    DEFAULT_CLIENT_NAME,
    DEFAULT_SCOPES,
    MAX_NAME_CHARS,
    client_object,
    is_client_name,
    pairing_code_object,
    parse_scopes,
)
from core.errors import NotFound
from core.quotas import LIMIT_NAMES, Limits
from core.settings import MAX_ACTIVE_TASKS_BOUND, MAX_STREAMS_BOUND, REQUESTS_PER_SECOND_BOUND
from core.store.clients import create_client, create_pairing_code, list_clients, revoke, set_limits
from core.store.pairing_codes import outstanding_codes, revoke_pairing_code
from infra.cli.context import JSON_OPTION, emit, store
from infra.cli.option_types import DecimalRange, DomainChecked


class _Rate(click.FloatRange):
    """A rate within the range, and a number: NaN passes every comparison a range
    makes (it was stored as NULL on SQLite, NaN on PostgreSQL)."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        rate = super().convert(value, param, ctx)
        if math.isnan(rate):
            self.fail("is not a number", param, ctx)
        return rate


# Comma-separated scope names, read by `core.clients.parse_scopes` (`scopes[i]` in its
# message is the i-th name of the list, counted from 0).
_SCOPE_LIST = DomainChecked("scopes", lambda text: parse_scopes(text.split(",")))


def _client_name(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """The API's rule for a client's name (`core.clients.is_client_name`): a control
    character in a name split the rows of `clients list` and reached the terminal."""
    if value is not None and not is_client_name(value):
        raise click.BadParameter(f"1..{MAX_NAME_CHARS} characters, no control character")
    return value


def _limit_options(command: Callable[..., None]) -> Callable[..., None]:
    """`--max-active-tasks`, `--requests-per-second`, `--max-streams` (core.quotas),
    within the bounds the API keeps too."""
    for option in reversed((
        click.option("--max-active-tasks", type=DecimalRange(0, MAX_ACTIVE_TASKS_BOUND),
                     default=None, help="Queued + running tasks at once (0 = unlimited)."),
        click.option("--requests-per-second", type=_Rate(0, REQUESTS_PER_SECOND_BOUND),
                     default=None, help="Requests per second, per API process (0 = unlimited)."),
        click.option("--max-streams", type=DecimalRange(1, MAX_STREAMS_BOUND), default=None,
                     help="SSE streams and waits at once, per API process."),
    )):
        command = option(command)
    return command


@click.command()
@click.option("--admin", is_flag=True, help="Grant the admin scope (everything).")
@click.option("--scopes", default=None, metavar="S,S", type=_SCOPE_LIST,
              help="Comma-separated scopes (default: " + ",".join(sorted(DEFAULT_SCOPES)) + ").")
@click.option("--name", default=None, callback=_client_name,
              help="The client's name: 1..200 characters, no control characters.")
@click.option("--token", "direct", is_flag=True,
              help="Create the client now and print its token instead of a pairing code.")
@_limit_options
@JSON_OPTION
def pair(admin: bool, scopes: frozenset[str] | None, name: str | None, direct: bool, as_json: bool,
         max_active_tasks: int | None, requests_per_second: float | None,
         max_streams: int | None) -> None:
    """A one-time pairing code for a new client (`POST /v1/pair`), or a token at once.
    Limits not given are the settings' defaults."""
    if admin and scopes is not None:  # it was ignored, and the client got every scope
        raise click.UsageError("--admin holds every scope; drop --scopes, or --admin to "
                               "grant only those scopes")
    limits = Limits(max_active_tasks, requests_per_second, max_streams)
    with store() as (settings, db):
        granted = frozenset({ADMIN}) if admin else (scopes or DEFAULT_SCOPES)
        if direct:
            issued = create_client(db, name=name or ("admin" if admin else DEFAULT_CLIENT_NAME),
                                   scopes=granted, limits=limits)
            emit(issued.public(), as_json=as_json)
        else:
            code = create_pairing_code(db, scopes=granted, name=name,
                                       ttl_seconds=settings.pairing_code_ttl_seconds,
                                       limits=limits)
            emit(code.public(), as_json=as_json)


@click.group("pairing-codes")
def pairing_codes() -> None:
    """Pairing codes not yet redeemed."""


@pairing_codes.command("list")
@JSON_OPTION
def pairing_codes_list(as_json: bool) -> None:
    """Every code that would still redeem, newest first; never a secret."""
    with store() as (_, db):
        rows, _ = outstanding_codes(db, made_by=None)
    emit([pairing_code_object(row) for row in rows], as_json=as_json,
         columns=("id", "name", "scopes", "created_at", "expires_at", "created_by"))


@pairing_codes.command("revoke")
@click.argument("code_id")
def pairing_codes_revoke(code_id: str) -> None:
    """The code (named by its id, the part before the `-`) no longer redeems."""
    with store() as (_, db):
        revoke_pairing_code(db, code_id, made_by=None)
    click.echo(f"revoked {code_id}")


@click.group()
def clients() -> None:
    """Paired clients."""


@clients.command("list")
@JSON_OPTION
def clients_list(as_json: bool) -> None:
    """Every client with its limits (`-`: the setting's default applies)."""
    with store() as (_, db):
        rows = [client_object(row) for row in list_clients(db)]
    emit(rows, as_json=as_json,
         columns=("id", "name", "scopes", "created_at", "revoked_at", *LIMIT_NAMES))


@clients.command("set")
@click.argument("client_id")
@_limit_options
@click.option("--default", "defaults", multiple=True, type=click.Choice(LIMIT_NAMES),
              help="Put this limit back to the setting's default (repeatable).")
@JSON_OPTION
def clients_set(client_id: str, max_active_tasks: int | None, requests_per_second: float | None,
                max_streams: int | None, defaults: tuple[str, ...], as_json: bool) -> None:
    """Change a client's limits; the API processes honour it within `poll_interval_ms`."""
    given: dict[str, float | None] = {"max_active_tasks": max_active_tasks,
                                      "requests_per_second": requests_per_second,
                                      "max_streams": max_streams}
    changes: dict[str, float | None] = {key: value for key, value in given.items()
                                        if value is not None}
    if contradicted := sorted(set(changes) & set(defaults)):
        name = contradicted[0]
        raise click.UsageError(f"--{name.replace('_', '-')} and --default {name} "
                               "contradict each other: give one of them")
    changes.update(dict.fromkeys(defaults))
    with store() as (_, db), _client_named():
        row = set_limits(db, client_id, changes)
    emit(client_object(row), as_json=as_json)


@clients.command("revoke")
@click.argument("client_id")
def clients_revoke(client_id: str) -> None:
    """Refuse the client's token from now on."""
    with store() as (_, db), _client_named():
        revoke(db, client_id)
    click.echo(f"revoked {client_id}")


@contextmanager
def _client_named() -> Iterator[None]:
    """`client_not_found` told with where the ids are listed."""
    try:
        yield
    except NotFound as exc:
        if exc.code != "client_not_found":
            raise
        raise click.ClickException(
            f"{exc.code}: {exc.message}; `taskward clients list` shows the ids") from None


COMMANDS: list[click.Command] = [pair, pairing_codes, clients]
