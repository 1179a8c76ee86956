"""The `taskward` console command: process commands and operator commands.

Commands are imported when they are run, not when the command line is parsed: a
`taskward sweeper` then loads the sweeper's modules only, not the HTTP server's or
every operator command's (measured: most of a sweeper's start-up was imports).
`COMMAND_MODULES` names each command's module; `tests/api/test_cli.py` checks it
against the modules' own `COMMANDS`.
"""

from __future__ import annotations

import importlib

import click

COMMAND_MODULES = {
    "migrate": "process", "recover": "process", "sweep": "process", "sweeper": "process",
    "run": "process", "serve": "serve", "pair": "operator", "clients": "operator",
    "models": "operator", "tasks": "operator", "dead-letters": "operator",
    "schedules": "schedules",
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMAND_MODULES)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module_name = COMMAND_MODULES.get(cmd_name)
        if module_name is None:
            return None
        module = importlib.import_module(f"infra.cli.{module_name}")
        return next(c for c in module.COMMANDS if c.name == cmd_name)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """taskward — a durable asynchronous task service for model inference."""
