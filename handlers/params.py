"""Path and query parameters shared by several routes, with their bounds.

Identifiers are checked for shape before they reach a query: a value no id can have
is refused as a validation error rather than sent to the store, where PostgreSQL
would reject some characters (NUL) outright.
"""

from __future__ import annotations

from typing import Annotated

from litestar.params import Parameter

ID_PATTERN = r"^[a-z]{1,12}_[0-9a-z]{1,40}$"

TaskId = Annotated[str, Parameter(pattern=ID_PATTERN, max_length=64,
                                  description="a task id (the same as its response id)")]
ClientId = Annotated[str, Parameter(pattern=ID_PATTERN, max_length=64)]
Cursor = Annotated[str | None, Parameter(pattern=ID_PATTERN, max_length=64,
                                         description="`next_cursor` of the previous page")]
PageLimit = Annotated[int, Parameter(ge=1, le=100)]
