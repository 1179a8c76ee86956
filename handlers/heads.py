"""`HEAD` wherever `GET` is served: one helper that makes a route's `HEAD` handler from
its `GET` handler.

HTTP requires `HEAD` of every `GET` resource, and load balancers, uptime checks and
link checkers probe with it; Litestar serves a method only where a handler is declared
for it, so a path with a `GET` handler alone answered `HEAD` with `405`. The `HEAD`
handler runs the `GET` handler's own function (same dependencies, same checks, same
reads: a console page still asks for its session, `/readyz` still asks the store) and
sends the answer `GET` would send without its body: the same status, headers and
cookies, `Content-Type` and `Content-Length` included (a `HEAD` handler that returned
`None`, as the probes' did, said `Content-Length: 0` or `4`). Failures go through the
same exception handlers as `GET`'s.
"""

from __future__ import annotations

import inspect
from typing import Any

from litestar import Litestar, Request, Response, head
from litestar.handlers import HTTPRouteHandler
from litestar.response.base import ASGIResponse


class _Bodiless(Response[None]):
    """`answer` as `GET` would send it (headers computed from its full body), with the
    body left out."""

    def __init__(self, answer: Response[Any]) -> None:
        super().__init__(None)
        self._answer = answer

    def to_asgi_response(self, app: Litestar | None, request: Request[Any, Any, Any],
                         **kwargs: Any) -> ASGIResponse:
        asgi = self._answer.to_asgi_response(app, request, **kwargs)
        asgi.is_head_response = True  # read when sending: the headers are already made
        return asgi


def head_of(get_handler: HTTPRouteHandler) -> HTTPRouteHandler:
    """The `HEAD` handler of `get_handler`'s paths: its function's answer, bodiless."""
    serve = get_handler.fn
    if not inspect.iscoroutinefunction(serve):  # it is awaited below
        raise TypeError(f"{serve.__name__}: head_of takes async GET handlers only")

    async def answer(*args: Any, **kwargs: Any) -> Response[None]:
        data = await serve(*args, **kwargs)
        return _Bodiless(data if isinstance(data, Response) else Response(data))

    # Litestar reads the parameters (the dependencies and query fields to provide) from
    # the signature and resolves their names in the module of `get_handler`.
    answer.__signature__ = inspect.signature(serve).replace(  # type: ignore[attr-defined]
        return_annotation=Response[None])
    answer.__annotations__ = {**serve.__annotations__, "return": Response[None]}
    answer.__module__ = serve.__module__
    answer.__name__ = answer.__qualname__ = f"{serve.__name__}_head"
    answer.__doc__ = serve.__doc__
    return head(list(get_handler.paths), media_type=get_handler.media_type,
                status_code=get_handler.status_code, opt=dict(get_handler.opt),
                tags=list(get_handler.tags or ()),
                include_in_schema=get_handler.include_in_schema)(answer)
