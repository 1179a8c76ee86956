"""Which upstream URLs taskward may open connections to.

Registering an upstream makes the service connect where the entry says, so a client
with `models:admin` could point it at an internal address. `TASKWARD_UPSTREAM_ALLOWED_HOSTS`
(host patterns) narrows that; it is checked at registration and again before every
request, since the setting may have changed since the entry was made.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from urllib.parse import urlsplit

MAX_URL_LENGTH = 2048


class UrlRefused(ValueError):
    """A base URL that cannot be used; `code` is the stable error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def normalized_base_url(url: str) -> str:
    """`url` without a trailing slash, or `UrlRefused` (`invalid_upstream_url`).

    An http(s) URL with a host, ending in `/v1` as OpenAI-compatible servers serve it,
    with no user info (a key belongs in `api_key_env`, never in a URL that is shown),
    no query and no fragment.
    """
    if len(url) > MAX_URL_LENGTH or any(ord(c) < 0x21 or ord(c) == 0x7F for c in url):
        raise UrlRefused("invalid_upstream_url", "a base URL is at most 2048 visible characters")
    try:
        parts = urlsplit(url)
        parts.port
    except ValueError:
        raise UrlRefused("invalid_upstream_url", "a base URL must be a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UrlRefused("invalid_upstream_url", "a base URL must be http(s)://host…/v1")
    if parts.username is not None or parts.password is not None:
        raise UrlRefused("invalid_upstream_url",
                         "a base URL must not carry credentials; use api_key_env")
    if parts.query or parts.fragment:
        raise UrlRefused("invalid_upstream_url", "a base URL has no query or fragment")
    trimmed = url.rstrip("/")
    if not trimmed.endswith("/v1"):
        raise UrlRefused("invalid_upstream_url", "a base URL ends in /v1")
    return trimmed


def check_allowed(url: str, patterns: tuple[str, ...]) -> None:
    """`UrlRefused` (`upstream_host_not_allowed`) unless the URL's host matches a pattern
    (`*` and `?` wildcards, case-insensitive); no patterns allow every host."""
    if not patterns:
        return
    host = (urlsplit(url).hostname or "").lower()
    if not any(fnmatchcase(host, pattern) for pattern in patterns):
        raise UrlRefused("upstream_host_not_allowed",
                         f"host {host!r} is not in TASKWARD_UPSTREAM_ALLOWED_HOSTS")
