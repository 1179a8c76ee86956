"""`taskward serve`: the API alone (granian workers, no sweeper)."""

from __future__ import annotations

import click

from core.settings import load_settings
from infra.cli.context import database
from infra.cli.listen_address import ensure_free, listen_options
from infra.cli.option_types import DecimalRange
from infra.server import serve as serve_api


@click.command()
@listen_options
@click.option("--workers", default=1, show_default=True, type=DecimalRange(1, 256),
              help="granian worker processes, each with its own app.")
def serve(host: str, port: int, workers: int) -> None:
    """Serve the HTTP API. Settings, the schema and the address are checked before any
    worker starts."""
    settings = load_settings()
    with database(settings, role="api"):
        pass
    port = ensure_free(host, port)
    serve_api(host=host, port=port, workers=workers,
              idle_timeout_seconds=settings.http_idle_timeout_seconds,
              max_connections=settings.http_max_connections)


COMMANDS: list[click.Command] = [serve]
