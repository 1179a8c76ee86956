"""Option values checked where click parses them, by the same domain checks the API
runs: a bad value is then a usage error naming the option (`Error: Invalid value for
'--opt': ...`, exit status 2, docs/cli.md), not an exit 1 that names an API field."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from core.cron import parse_cron
from core.decimal_text import NOT_DECIMAL, is_decimal_integer
from core.errors import InvalidInput


class DomainChecked(click.ParamType):
    """A value `read` by a domain check (its `InvalidInput` is the usage error, code
    and message kept); what `read` returns is what the command gets. A default that is
    not text is taken as already read."""

    def __init__(self, name: str, read: Callable[[str], object]) -> None:
        self.name = name
        self._read = read

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> object:
        if not isinstance(value, str):
            return value
        try:
            return self._read(value)
        except InvalidInput as exc:
            self.fail(f"{exc.code}: {exc.message}", param, ctx)


class DecimalRange(click.IntRange):
    """An integer in the range, written as the API reads a query's integer: click's
    `int()` took `05`, `+5`, ` 5`, `5_0` and non-ASCII digits, where the API refuses
    them (`tasks list --priority 05` listed what `GET /v1/tasks?priority=05` refuses).
    Every integer option of the CLI is one, so the CLI has one rule for them."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not is_decimal_integer(value):
            self.fail(NOT_DECIMAL, param, ctx)
        return super().convert(value, param, ctx)


def _cron_text(text: str) -> str:
    """`text`, once `core.cron` takes it as an expression."""
    parse_cron(text)
    return text


# A cron expression as `core.cron` takes it (`--schedule`, `schedules add --cron`).
CRON_EXPRESSION = DomainChecked("cron", _cron_text)
