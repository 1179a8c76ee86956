"""The errors behind an error: the one it was raised from, or raised while handling.

A store outage and an upstream failure are both told by an error down the chain (the
driver's SQLSTATE under SQLAlchemy's wrapper, the socket's or the TLS layer's under
httpx's), so one walk serves both; what to look for stays with each caller.
"""

from __future__ import annotations

from collections.abc import Iterator


def error_chain(error: BaseException | None, *, handled: bool = True) -> Iterator[BaseException]:
    """`error`, then each error behind it, nearest first: the one it was raised from
    (`raise ... from`: `__cause__`), else, with `handled`, the one being handled when
    it was raised (`__context__`). Without `handled` only what an error was raised
    from counts: a bug met while handling an outage is not the outage. Each error
    comes once, so a chain that loops back on itself ends."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or (error.__context__ if handled else None)
