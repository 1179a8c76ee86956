"""Operator commands: models, tasks, dead-letters (client commands: `infra.cli.clients`).

They work on the store directly (an operator on the machine needs no token) through
the same core functions the API calls, so a CLI answer and an API answer agree. Each
that shows objects or lists prints a table, or one JSON document with `--json`; those
that remove print one line and take no `--json` (docs/cli.md lists which).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from core.errors import InvalidInput
from core.model_files import DEFAULT_ENGINE
from core.models_registry import (
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_TIMEOUT_SECONDS,
    MAX_CONCURRENCY_LIMIT,
    register,
    register_upstream,
)
from core.objects import model_object, task_object
from core.priorities import HIGHEST_PRIORITY, LOWEST_PRIORITY
from core.states import Status
from core.store.models import list_models, remove
from core.store.new_tasks import retry_failed
from core.store.schedules import schedules_of_model
from core.store.tasks import cancel, get_task, list_tasks
from infra.cli.context import JSON_OPTION, emit, store
from infra.cli.option_types import DecimalRange

_TASK_COLUMNS = ("id", "status", "priority", "model", "client_id", "attempts", "created_at",
                 "error")


@click.group()
def models() -> None:
    """The model registry (files stay on disk)."""


# A hash shorter than this stays silent: most files are hashed in well under it.
_SILENT_HASH_SECONDS = 2.0


class _HashProgress:
    """`hashing FILE: n/N GB` on standard error once a hash has taken longer than
    `_SILENT_HASH_SECONDS` (a 40 GB model is minutes of an otherwise silent command);
    rewritten in place on a terminal, a line every few seconds into a log. Standard
    output, the table or the `--json` document, is untouched."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.started = time.monotonic()
        self.shown_at: float | None = None
        self.on_terminal = sys.stderr.isatty()

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        pause = 0.2 if self.on_terminal else 5.0
        if now - self.started < _SILENT_HASH_SECONDS or (
                self.shown_at is not None and now - self.shown_at < pause and done < total):
            return
        if self.shown_at is None and done == total:
            return  # finished before it was ever shown: nothing to end
        self.shown_at = now
        line = f"hashing {self.name}: {done / 1e9:.1f}/{total / 1e9:.1f} GB"
        if self.on_terminal:
            click.echo(f"\r{line}", err=True, nl=done == total)
        else:
            click.echo(line, err=True)


@models.command("add")
@click.argument("path")
@click.option("--id", "model_id", default=None,
              help="Default: the file name without extension.")
@click.option("--engine", default=DEFAULT_ENGINE, show_default=True)
@JSON_OPTION
def models_add(path: str, model_id: str | None, engine: str, as_json: bool) -> None:
    """Register PATH (from the current directory, else from the models directory)."""
    # os.path.exists is False for a name the file system refuses (too long, say): the
    # registry then refuses it in one line like any other unreadable path.
    located = Path(path).absolute() if os.path.exists(path) else Path(path)
    with store() as (settings, db):
        with _outside_named(settings.models_dir):
            row = register(db, settings.models_dir, located, model_id=model_id, engine=engine,
                           progress=_HashProgress(path))
    emit(model_object(row), as_json=as_json)


@contextmanager
def _outside_named(models_dir: Path) -> Iterator[None]:
    """`model_path_outside_models_dir` told with the directory it must be in (the
    operator's own, unlike an API client's) and what to do about it."""
    try:
        yield
    except InvalidInput as exc:
        if exc.code != "model_path_outside_models_dir":
            raise
        raise click.ClickException(
            f"{exc.code}: {exc.message}; copy (or move) the file into the models directory "
            f"{str(models_dir)!r} (TASKWARD_MODELS_DIR) and add it from there") from None


@models.command("add-upstream")
@click.argument("model_id", metavar="ID")
@click.option("--base-url", "base_urls", multiple=True, required=True, metavar="URL",
              help="An OpenAI-compatible server's URL ending in /v1 (repeat for several).")
@click.option("--upstream-model", required=True, metavar="NAME",
              help="The model's name on the upstream server.")
@click.option("--api-key-env", default=None, metavar="VAR",
              help="The environment variable that holds the upstream's bearer key.")
@click.option("--max-concurrency", default=DEFAULT_MAX_CONCURRENCY, show_default=True,
              type=DecimalRange(1, MAX_CONCURRENCY_LIMIT),
              help="Attempts in flight across all sweepers.")
@click.option("--timeout-seconds", default=DEFAULT_TIMEOUT_SECONDS, show_default=True,
              type=float, help="Connect and read timeout of each upstream request.")
@JSON_OPTION
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
@JSON_OPTION
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
@click.option("--priority", type=DecimalRange(HIGHEST_PRIORITY, LOWEST_PRIORITY), default=None)
@click.option("--limit", default=20, show_default=True, type=DecimalRange(1, 1000))
@JSON_OPTION
def tasks_list(status: str | None, priority: int | None, limit: int, as_json: bool) -> None:
    with store() as (_, db):
        rows, _ = list_tasks(db, None, status=Status(status) if status else None,
                             priority=priority, limit=limit)
    emit([task_object(row) for row in rows], as_json=as_json, columns=_TASK_COLUMNS)


@tasks.command("show")
@click.argument("task_id")
@JSON_OPTION
def tasks_show(task_id: str, as_json: bool) -> None:
    with store() as (_, db):
        row = get_task(db, task_id, None)
    emit(task_object(row), as_json=as_json)


@tasks.command("cancel")
@click.argument("task_id")
@JSON_OPTION
def tasks_cancel(task_id: str, as_json: bool) -> None:
    """Cancel a queued task at once, or ask the worker of a running one to stop."""
    with store() as (_, db):
        outcome = cancel(db, task_id, None)
    emit(task_object(outcome.task), as_json=as_json, columns=_TASK_COLUMNS)


@click.group("dead-letters")
def dead_letters() -> None:
    """Failed tasks whose attempts are spent."""


@dead_letters.command("list")
@click.option("--limit", default=20, show_default=True, type=DecimalRange(1, 1000))
@JSON_OPTION
def dead_letters_list(limit: int, as_json: bool) -> None:
    with store() as (_, db):
        rows, _ = list_tasks(db, None, dead_lettered=True, limit=limit)
    emit([task_object(row) for row in rows], as_json=as_json, columns=_TASK_COLUMNS)


@dead_letters.command("retry")
@click.argument("task_id")
@JSON_OPTION
def dead_letters_retry(task_id: str, as_json: bool) -> None:
    """Run a failed task's request again as a new task."""
    with store() as (settings, db):
        row = retry_failed(db, task_id, settings.max_attempts_default)
    emit(task_object(row), as_json=as_json, columns=_TASK_COLUMNS)


COMMANDS: list[click.Command] = [models, tasks, dead_letters]
