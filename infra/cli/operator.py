"""Operator commands: pair, clients, models, tasks, dead-letters."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
