"""How an integer is written wherever taskward reads one from text a client or an
operator typed (a query, a header, a CLI option): decimal digits after an optional
minus, without a leading zero, a plus, spaces, `_` or non-ASCII digits, all of which
Python's `int()` takes. One rule, so that `taskward tasks list --priority 05` does not
list what `GET /v1/tasks?priority=05` refuses."""

from __future__ import annotations

import re

_DECIMAL_INTEGER = re.compile(r"-?(?:0|[1-9][0-9]*)")
NOT_DECIMAL = "must be an integer written in decimal digits, without leading zeros"


def is_decimal_integer(text: str) -> bool:
    return _DECIMAL_INTEGER.fullmatch(text) is not None
