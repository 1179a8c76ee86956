"""HTML answers of the console: Jinja2 templates shipped in this package.

Autoescaping is on for every template, so task fields, error messages and output text
are always shown as text. Every page goes out with a Content-Security-Policy that
admits only this service's own script, styles and connections, so even a page that
shows hostile output text cannot run anything or send it anywhere.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import UTC, datetime
from functools import cache
from importlib.resources import files
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from litestar import Response
from litestar.enums import MediaType

PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
ASSETS = ("console.css", "console.js")


def duration(ms: int | None) -> str:
    """A wait or age for people: `45 s`, `12 min 5 s`, `3 h 20 min`."""
    if ms is None:
        return "–"
    seconds = max(0, ms // 1000)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def moment(ms: int | None) -> str:
    if ms is None:
        return "–"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def asset_bytes(name: str) -> bytes:
    return (files("handlers.console") / "static" / name).read_bytes()


@cache
def asset_url(name: str) -> str:
    """The asset's address with its content digest, so browsers may cache it for good."""
    digest = hashlib.sha256(asset_bytes(name)).hexdigest()[:12]
    return f"/console/static/{name}?v={digest}"


@cache
def _environment() -> Environment:
    env = Environment(loader=PackageLoader("handlers.console", "templates"),
                      autoescape=select_autoescape(default=True, default_for_string=True),
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(duration=duration, moment=moment)
    env.globals.update(asset_url=asset_url)
    return env


def html(template: str, status_code: int = 200, headers: Mapping[str, str] | None = None,
         **context: Any) -> Response[str]:
    """A page with `PAGE_HEADERS`; `headers`: more of the answer's (a 405's `Allow`)."""
    body = _environment().get_template(template).render(**context)
    return Response(body, status_code=status_code, media_type=MediaType.HTML,
                    headers={**PAGE_HEADERS, **(headers or {})})
