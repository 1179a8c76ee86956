"""What every command needs: settings, an open database, and output as table or JSON.

Errors an operator can fix end the command with exit status 1 and a message that says
what to do next, never a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import click
from sqlalchemy.exc import DataError, DBAPIError

from core.engines.registry import import_engine_modules
from core.errors import DomainError, unstorable_value
from core.settings import Settings, load_settings
from core.store.connect import ProcessRole, open_database
from core.store.database import Database
from core.store.outage import TABLE_PRIVILEGES, is_privilege_refused
from infra.migrate import check_schema

# What every command that shows objects or lists takes (docs/cli.md lists which).
JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")


@contextmanager
def database(settings: Settings, *, check: bool = True,
             role: ProcessRole = "cli") -> Iterator[Database]:
    """An open database, schema-checked unless `check` is False (migrate itself), its
    connections named for `role` (`core.store.connect`). A SQLite store that does not
    exist is created only unchecked: a checked one could only be refused as behind, and
    the command would leave an empty database (and its directories) behind."""
    db = open_database(settings, role=role, create=not check)
    try:
        with privileges_named():
            if check:
                with domain_errors():
                    check_schema(db.engine)
            yield db
    finally:
        db.dispose()


@contextmanager
def privileges_named() -> Iterator[None]:
    """Turn PostgreSQL refusing this role a store table into one line with the GRANT
    to make, and exit status 1; the other outages keep the CLI's line that says to
    check the server."""
    try:
        yield
    except DBAPIError as exc:
        if not is_privilege_refused(exc):
            raise
        cause = exc.orig or exc
        said = next(iter(str(cause).strip().splitlines()), "")
        raise click.ClickException(
            f"the store refused this role ({type(cause).__name__}: {said}); grant the "
            f"role of TASKWARD_DATABASE_URL {TABLE_PRIVILEGES} on taskward's tables "
            f"(GRANT {TABLE_PRIVILEGES} ON ALL TABLES IN SCHEMA <schema> TO <role>), "
            "then run the command again") from None


@contextmanager
def store() -> Iterator[tuple[Settings, Database]]:
    """What an operator command works on: the settings and the schema-checked database;
    a domain error ends the command with its code and message, and so does a value the
    store refuses that no check caught (PostgreSQL takes no NUL character in text),
    as the API answers it: `422 validation_error`."""
    settings = load_settings()
    with database(settings) as db, domain_errors():
        import_engine_modules(settings.engine_module_names)  # `models add` checks names
        try:
            yield settings, db
        except DataError:
            raise unstorable_value() from None


@contextmanager
def domain_errors() -> Iterator[None]:
    """Turn a domain error into a one-line message and exit status 1."""
    try:
        yield
    except DomainError as exc:
        raise click.ClickException(f"{exc.code}: {exc.message}") from None


def emit(value: Any, *, as_json: bool, columns: Sequence[str] | None = None) -> None:
    """Print `value` as one JSON document, or as a readable table of `columns`."""
    if as_json:
        click.echo(json.dumps(value, ensure_ascii=False))
        return
    rows = value if isinstance(value, list) else [value]
    if not rows:
        click.echo("(none)")
        return
    keys = list(columns or rows[0].keys())
    cells = [[_cell(row.get(k)) for k in keys] for row in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    click.echo("  ".join(k.upper().ljust(w) for k, w in zip(keys, widths)))
    for line in cells:
        click.echo("  ".join(c.ljust(w) for c, w in zip(line, widths)))


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)
