"""`OPTIONS` answers with every method of its path, as a `405` there does.

Litestar gives each path an `OPTIONS` handler when it builds the path's route, and
rebuilds the route each time another handler joins the path, keeping the handler it
made first: that one's `Allow` lists the methods of the first handler alone
(`OPTIONS /v1/pairing-codes` said `OPTIONS, POST` where `GET` is served too). Once the
app is built, `answer_options_in_full` knows each path's final methods, and puts them
in the `Allow` of the `OPTIONS` answers on their way out.
"""

from __future__ import annotations

from litestar import Litestar
from litestar.enums import HttpMethod, ScopeType
from litestar.routes import HTTPRoute
from litestar.types import ASGIApp, HTTPResponseStartEvent, Message, Receive, Scope, Send

_ALLOW = b"allow"


def answer_options_in_full(app: Litestar) -> ASGIApp:
    """`app.asgi_handler` with each `OPTIONS` answer's `Allow` naming every method its
    path serves; call it once the app's routes are all registered."""
    allowed = {route.path_format: ", ".join(sorted(route.methods)).encode()
               for route in app.routes if isinstance(route, HTTPRoute)}
    handle = app.asgi_handler

    async def answering(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP or scope["method"] != HttpMethod.OPTIONS:
            await handle(scope, receive, send)
            return

        async def send_allowing(message: Message) -> None:
            # `path_template` is set once the request is routed (a 404 has none).
            methods = allowed.get(scope.get("path_template", ""))
            if message["type"] == "http.response.start" and methods is not None:
                message = _with_allow(message, methods)
            await send(message)

        await handle(scope, receive, send_allowing)

    return answering


def _with_allow(start: HTTPResponseStartEvent, methods: bytes) -> HTTPResponseStartEvent:
    """`start` with its `Allow` header, if it has one, set to `methods`."""
    headers = start["headers"]
    if not any(name.lower() == _ALLOW for name, _ in headers):
        return start
    kept = [(name, value) for name, value in headers if name.lower() != _ALLOW]
    return {**start, "headers": [*kept, (_ALLOW, methods)]}
