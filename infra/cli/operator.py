"""Operator commands: pair, pairing-codes, clients, models, tasks, dead-letters.

They work on the store directly (an operator on the machine needs no token) through
the same core functions the API calls, so a CLI answer and an API answer agree. Each
that shows objects or lists prints a table, or one JSON document with `--json`; those
that remove or revoke print one line and take no `--json` (docs/cli.md lists which).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
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
from core.model_files import DEFAULT_ENGINE
from core.models_registry import (
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_TIMEOUT_SECONDS,
    register,
    register_upstream,
)
from core.objects import model_object, task_object
from core.priorities import HIGHEST_PRIORITY, LOWEST_PRIORITY
from core.quotas import LIMIT_NAMES, Limits
from core.settings import MAX_ACTIVE_TASKS_BOUND, MAX_STREAMS_BOUND, REQUESTS_PER_SECOND_BOUND
from core.states import Status
from core.store.clients import create_client, create_pairing_code, list_clients, revoke, set_limits
from core.store.models import list_models, remove
from core.store.new_tasks import retry_failed
from core.store.pairing_codes import outstanding_codes, revoke_pairing_code
from core.store.schedules import schedules_of_model
from core.store.tasks import cancel, get_task, list_tasks
from infra.cli.context import emit, store

_JSON = click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")


class _Rate(click.FloatRange):
    """A rate within the range, and a number: NaN passes every comparison a range
    makes (it was stored as NULL on SQLite, NaN on PostgreSQL)."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        rate = super().convert(value, param, ctx)
        if math.isnan(rate):
            self.fail("is not a number", param, ctx)
        return rate


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
        click.option("--max-active-tasks", type=click.IntRange(0, MAX_ACTIVE_TASKS_BOUND),
                     default=None, help="Queued + running tasks at once (0 = unlimited)."),
        click.option("--requests-per-second", type=_Rate(0, REQUESTS_PER_SECOND_BOUND),
                     default=None, help="Requests per second, per API process (0 = unlimited)."),
        click.option("--max-streams", type=click.IntRange(1, MAX_STREAMS_BOUND), default=None,
                     help="SSE streams and waits at once, per API process."),
    )):
        command = option(command)
    return command
_TASK_COLUMNS = ("id", "status", "priority", "model", "client_id", "attempts", "created_at",
                 "error")


@click.command()
@click.option("--admin", is_flag=True, help="Grant the admin scope (everything).")
@click.option("--scopes", default=None, metavar="S,S",
              help="Comma-separated scopes (default: " + ",".join(sorted(DEFAULT_SCOPES)) + ").")
@click.option("--name", default=None, callback=_client_name,
              help="The client's name: 1..200 characters, no control characters.")
@click.option("--token", "direct", is_flag=True,
              help="Create the client now and print its token instead of a pairing code.")
@_limit_options
@_JSON
def pair(admin: bool, scopes: str | None, name: str | None, direct: bool, as_json: bool,
         max_active_tasks: int | None, requests_per_second: float | None,
         max_streams: int | None) -> None:
    """A one-time pairing code for a new client (`POST /v1/pair`), or a token at once.
    Limits not given are the settings' defaults."""
    limits = Limits(max_active_tasks, requests_per_second, max_streams)
    with store() as (settings, db):
        granted = frozenset({ADMIN}) if admin else (
            parse_scopes(scopes.split(",")) if scopes is not None else DEFAULT_SCOPES)
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
@_JSON
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
@_JSON
def clients_list(as_json: bool) -> None:
    with store() as (_, db):
        rows = [client_object(row) for row in list_clients(db)]
    emit(rows, as_json=as_json, columns=("id", "name", "scopes", "created_at", "revoked_at"))


@clients.command("set")
@click.argument("client_id")
@_limit_options
@click.option("--default", "defaults", multiple=True, type=click.Choice(LIMIT_NAMES),
              help="Put this limit back to the setting's default (repeatable).")
@_JSON
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
    with store() as (_, db):
        row = set_limits(db, client_id, changes)
    emit(client_object(row), as_json=as_json)


@clients.command("revoke")
@click.argument("client_id")
def clients_revoke(client_id: str) -> None:
    """Refuse the client's token from now on."""
    with store() as (_, db):
        revoke(db, client_id)
    click.echo(f"revoked {client_id}")


@click.group()
def models() -> None:
    """The model registry (files stay on disk)."""


@models.command("add")
@click.argument("path")
@click.option("--id", "model_id", default=None, help="Default: the file name without extension.")
@click.option("--engine", default=DEFAULT_ENGINE, show_default=True)
@_JSON
def models_add(path: str, model_id: str | None, engine: str, as_json: bool) -> None:
    """Register PATH (from the current directory, else from the models directory)."""
    # os.path.exists is False for a name the file system refuses (too long, say): the
    # registry then refuses it in one line like any other unreadable path.
    located = Path(path).absolute() if os.path.exists(path) else Path(path)
    with store() as (settings, db):
        row = register(db, settings.models_dir, located, model_id=model_id, engine=engine)
    emit(model_object(row), as_json=as_json)


@models.command("add-upstream")
@click.argument("model_id", metavar="ID")
@click.option("--base-url", "base_urls", multiple=True, required=True, metavar="URL",
              help="An OpenAI-compatible server's URL ending in /v1 (repeat for several).")
@click.option("--upstream-model", required=True, metavar="NAME",
              help="The model's name on the upstream server.")
@click.option("--api-key-env", default=None, metavar="VAR",
              help="The environment variable that holds the upstream's bearer key.")
@click.option("--max-concurrency", default=DEFAULT_MAX_CONCURRENCY, show_default=True,
              type=int, help="Attempts in flight across all sweepers (1..4096).")
@click.option("--timeout-seconds", default=DEFAULT_TIMEOUT_SECONDS, show_default=True,
              type=float, help="Connect and read timeout of each upstream request.")
@_JSON
def models_add_upstream(
    model_id: str, base_urls: tuple[str, ...], upstream_model: str, api_key_env: str | None,
    max_concurrency: int, timeout_seconds: float, as_json: bool,
) -> None:
    """Route model ID to inference servers you run (docs/upstream.md)."""
    with store() as (settings, db):
        row = register_upstream(db, model_id, base_urls=list(base_urls), model=upstream_model,
                                api_key_env=api_key_env, max_concurrency=max_concurrency,
                                timeout_seconds=timeout_seconds,
                                allowed_hosts=settings.upstream_host_patterns,
                                allowed_key_envs=settings.upstream_key_env_patterns)
    emit(model_object(row), as_json=as_json)


@models.command("list")
@_JSON
def models_list(as_json: bool) -> None:
    with store() as (_, db):
        rows = [model_object(row) for row in list_models(db)]
    emit(rows, as_json=as_json,
         columns=("id", "engine", "path", "size_bytes", "sha256", "upstream"))


@models.command("remove")
@click.argument("model_id")
def models_remove(model_id: str) -> None:
    """Remove the entry; the file is kept. Schedules that still name the model are
    told on standard error: each of their slots passes without a task from now on."""
    with store() as (_, db):
        remove(db, model_id)
        orphaned = schedules_of_model(db, model_id)
    click.echo(f"removed {model_id}")
    if orphaned:
        click.echo(f"{orphaned} schedule(s) still name {model_id} and create no task until "
                   "it is registered again or they are removed (`taskward schedules list`, "
                   "`taskward schedules remove`)", err=True)


@click.group()
def tasks() -> None:
    """Tasks of every client."""


@tasks.command("list")
@click.option("--status", type=click.Choice([s.value for s in Status]), default=None)
@click.option("--priority", type=click.IntRange(HIGHEST_PRIORITY, LOWEST_PRIORITY), default=None)
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 1000))
@_JSON
def tasks_list(status: str | None, priority: int | None, limit: int, as_json: bool) -> None:
    with store() as (_, db):
        rows, _ = list_tasks(db, None, status=Status(status) if status else None,
                             priority=priority, limit=limit)
    emit([task_object(row) for row in rows], as_json=as_json, columns=_TASK_COLUMNS)


@tasks.command("show")
@click.argument("task_id")
@_JSON
def tasks_show(task_id: str, as_json: bool) -> None:
    with store() as (_, db):
        row = get_task(db, task_id, None)
    emit(task_object(row), as_json=as_json)


@tasks.command("cancel")
@click.argument("task_id")
@_JSON
def tasks_cancel(task_id: str, as_json: bool) -> None:
    """Cancel a queued task at once, or ask the worker of a running one to stop."""
    with store() as (_, db):
        outcome = cancel(db, task_id, None)
    emit(task_object(outcome.task), as_json=as_json, columns=_TASK_COLUMNS)


@click.group("dead-letters")
def dead_letters() -> None:
    """Failed tasks whose attempts are spent."""


@dead_letters.command("list")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 1000))
@_JSON
def dead_letters_list(limit: int, as_json: bool) -> None:
    with store() as (_, db):
        rows, _ = list_tasks(db, None, dead_lettered=True, limit=limit)
    emit([task_object(row) for row in rows], as_json=as_json, columns=_TASK_COLUMNS)


@dead_letters.command("retry")
@click.argument("task_id")
@_JSON
def dead_letters_retry(task_id: str, as_json: bool) -> None:
    """Run a failed task's request again as a new task."""
    with store() as (settings, db):
        row = retry_failed(db, task_id, settings.max_attempts_default)
    emit(task_object(row), as_json=as_json, columns=_TASK_COLUMNS)


COMMANDS: list[click.Command] = [pair, pairing_codes, clients, models, tasks, dead_letters]
