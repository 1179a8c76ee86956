"""The `taskward` console command: process commands and operator commands."""

from __future__ import annotations

import click

from infra.cli import operator, process, schedules, serve


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """taskward — a durable asynchronous task service for model inference."""


for _module in (process, serve, operator, schedules):
    for _command in _module.COMMANDS:
        main.add_command(_command)
