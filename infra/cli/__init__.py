"""The `taskward` console command: process commands and operator commands.

Commands are imported when they are run, not when the command line is parsed: a
`taskward sweeper` then loads the sweeper's modules only, not the HTTP server's or
every operator command's (measured: most of a sweeper's start-up was imports).
`COMMAND_MODULES` names each command's module; `tests/api/test_cli.py` checks it
against the modules' own `COMMANDS`.

A command's modules are imported with the cyclic garbage collector paused: imports
allocate ~75,000 tracked objects that live as long as the process (~600 of them are
garbage), and the collector scanning them again and again while they were allocated
was ~12 % of a sweeper's import CPU (issue 15).
"""

from __future__ import annotations

import gc
import importlib
from collections.abc import Iterator
from contextlib import contextmanager

import click

COMMAND_MODULES = {
    "migrate": "process", "recover": "process", "sweep": "process", "sweeper": "process",
    "run": "process", "serve": "serve", "pair": "clients", "pairing-codes": "clients",
    "clients": "clients", "models": "operator", "tasks": "operator",
    "dead-letters": "operator",
    "schedules": "schedules",
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMAND_MODULES)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module_name = COMMAND_MODULES.get(cmd_name)
        if module_name is None:
            return None
        with collector_paused():
            module = importlib.import_module(f"infra.cli.{module_name}")
        return next(c for c in module.COMMANDS if c.name == cmd_name)

    def invoke(self, ctx: click.Context) -> object:
        """Run the command; a store that cannot be reached (or takes no writes) ends it
        with one line that says so and what to check, not a driver's traceback, and so
        does an unusable setting, found at start-up or once the command is under way (a
        database URL that names no store: `core.store.connect`). The one place each is
        told: the commands load their settings and leave both to this."""
        try:
            return super().invoke(ctx)
        except Exception as exc:
            from core.settings import SettingsError  # loaded by now: the command ran

            if isinstance(exc, SettingsError):
                raise click.ClickException(f"configuration error: {exc}") from None
            from core.store.outage import is_store_outage  # loaded by now: it failed

            if not is_store_outage(exc):
                raise
            cause = getattr(exc, "orig", None) or exc
            said = next(iter(str(cause).strip().splitlines()), "")
            raise click.ClickException(
                f"the store is unavailable ({type(cause).__name__}: {said}); check "
                "TASKWARD_DATABASE_URL and that the database server is up and takes "
                "writes, then run the command again") from None


@contextmanager
def collector_paused(*, freeze: bool = False) -> Iterator[None]:
    """Run an import-heavy block without cyclic collections (the next collection runs
    once it ends). A no-op when the collector is off already.

    `freeze`: what exists once the block ends is moved out of the collector's sight
    for good (`gc.freeze`), for a long-running process whose start-up this block was:
    its full collections then no longer walk the ~80,000 objects of the imports again
    and again (measured on a draining sweeper: ~25 us of CPU per task, issue 15).
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        gc.enable()


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """taskward — a durable asynchronous task service for model inference."""
