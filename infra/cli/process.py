"""Process commands: migrate, recover, serve, sweep, sweeper, run."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
