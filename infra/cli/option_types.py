"""Option values checked where click parses them, by the same domain checks the API
runs: a bad value is then a usage error naming the option (`Error: Invalid value for
'--opt': ...`, exit status 2, docs/cli.md), not an exit 1 that names an API field."""

from __future__ import annotations

import click

from core.cron import parse_cron
from core.errors import InvalidInput


class CronExpression(click.ParamType):
    """A cron expression as `core.cron` takes it (`--schedule`, `schedules add --cron`)."""

    name = "cron"

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> str:
        try:
            parse_cron(str(value))
        except InvalidInput as exc:
            self.fail(f"{exc.code}: {exc.message}", param, ctx)
        return str(value)
