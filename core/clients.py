"""Clients, bearer tokens, scopes and one-time pairing codes: what they are
(docs/http-api.md). `core.store.clients` keeps them.

Only hashes of tokens and pairing secrets are stored. A pairing code is
`<code id>-<secret>`: the id finds the row, so a wrong secret can be counted against
that code and the code burnt after `MAX_PAIRING_FAILURES`, without ever storing the
secret itself. Every check that compares a secret uses `core.ids.same_secret`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row

from core.bodies import NO_CONTROL
from core.clock import iso
from core.errors import Forbidden, InvalidInput
from core.quotas import LIMIT_NAMES, Limits, first_looser
from core.settings import Settings

ADMIN = "admin"
SCOPES: tuple[str, ...] = (
    "responses:create",
    "tasks:read",
    "tasks:cancel",
    "models:read",
    "models:admin",
    "clients:admin",
    ADMIN,
)
# What a paired client gets when nobody says otherwise: it can do its own work.
DEFAULT_SCOPES: frozenset[str] = frozenset(
    {"responses:create", "tasks:read", "tasks:cancel", "models:read"}
)
MAX_PAIRING_FAILURES = 5
DEFAULT_CLIENT_NAME = "client"
MAX_NAME_CHARS = 200  # a client's name (`clients.name`): 1..200, no control character
_CODE_ID = r"pc_[0-9a-z]{20}"
_CODE = re.compile(rf"^({_CODE_ID})-([A-Za-z0-9_-]{{1,64}})$")


@dataclass(frozen=True)
class Client:
    """An authenticated caller. `admin` implies every other scope."""

    id: str
    name: str
    scopes: frozenset[str]
    limits: Limits = Limits()

    def allows(self, scope: str) -> bool:
        return ADMIN in self.scopes or scope in self.scopes

    @property
    def owner_filter(self) -> str | None:
        """The client id that store reads are limited to; None when it may see all."""
        return None if ADMIN in self.scopes else self.id


@dataclass(frozen=True)
class IssuedCode:
    code: str
    expires_at: int
    scopes: frozenset[str]

    def public(self) -> dict[str, Any]:
        """`{"id", "code", "expires_at", "scopes"}`, as the API and `taskward pair --json`
        show it: `id` (the code's part before its `-`) is what `DELETE
        /v1/pairing-codes/{id}` and `taskward pairing-codes revoke` take, so the maker
        of a code can take it back without listing the outstanding ones."""
        return {"id": self.code.partition("-")[0], "code": self.code,
                "expires_at": iso(self.expires_at), "scopes": sorted(self.scopes)}


@dataclass(frozen=True)
class IssuedToken:
    """A new client's credentials; the token is shown here once and never again."""

    client_id: str
    token: str
    scopes: frozenset[str]

    def public(self) -> dict[str, Any]:
        """`{"client_id", "token", "scopes"}`, as `POST /v1/pair` and the CLI show it."""
        return {"client_id": self.client_id, "token": self.token, "scopes": sorted(self.scopes)}


def is_client_name(name: str) -> bool:
    """Whether `name` may name a client: what the API's bodies and the CLI accept."""
    return len(name) <= MAX_NAME_CHARS and re.match(NO_CONTROL, name) is not None


def parse_pairing_code(code: str) -> tuple[str, str] | None:
    """(code id, secret) of a well-formed pairing code, else None."""
    match = _CODE.match(code)
    return None if match is None else (match.group(1), match.group(2))


def is_pairing_code_id(text: str) -> bool:
    """Whether `text` could be a pairing code's id (its part before the `-`): what has
    not names no code, and is never looked up."""
    return re.fullmatch(_CODE_ID, text) is not None


def parse_scopes(values: Iterable[str]) -> frozenset[str]:
    """Known scope names, or `unknown_scope`; at least one is required."""
    listed = [value.strip() for value in values]
    unknown = [at for at, scope in enumerate(listed) if scope and scope not in SCOPES]
    if unknown:  # named by its place: a value sent is never repeated
        raise InvalidInput("unknown_scope", f"scopes[{unknown[0]}] is not a known scope; "
                           "known: " + ", ".join(SCOPES), extra={"field": "scopes"})
    scopes = frozenset(scope for scope in listed if scope)
    if not scopes:
        raise InvalidInput("validation_error", "at least one scope is required",
                           extra={"field": "scopes"})
    return scopes


def require_may_manage(by: Client | None, target_scopes: frozenset[str]) -> None:
    """`admin_required` unless `by` may revoke or re-scope a client holding
    `target_scopes` (None: an operator on the machine, who may): every change to an
    `admin` client needs `admin` itself, or `clients:admin` alone could lock every
    admin out."""
    if by is not None and ADMIN in target_scopes and ADMIN not in by.scopes:
        raise Forbidden("admin_required", "only an admin client may change an admin client")


def require_may_limit(by: Client, client_id: str) -> None:
    """`own_limits_refused` unless `by` holds `admin` or names another client: a
    tenant given `clients:admin` to manage clients of its own must not lift the quotas
    it was itself given."""
    if by.id == client_id and ADMIN not in by.scopes:
        raise Forbidden("own_limits_refused", "a client without admin may not change its "
                        "own limits")


def require_within_own_limits(by: Client, granted: Mapping[str, Any], settings: Settings) -> None:
    """`limits_exceed_own` unless `by` holds `admin` or none of the limits it sets or
    hands out in `granted` (name -> value, None: the setting's default) is looser than
    its own: else a tenant refused its own limits (`require_may_limit`) would mint a
    `clients:admin` client to lift them, or pair unlimited workers."""
    if ADMIN in by.scopes:
        return
    name = first_looser(granted, by.limits, settings)
    if name is not None:
        raise Forbidden("limits_exceed_own", f"{name} would be looser than the caller's own "
                        "limit: a client without admin may not set or hand out more than "
                        "it holds", extra={"field": name})


def scope_text(scopes: Iterable[str]) -> str:
    return " ".join(sorted(scopes))


def scope_set(text: str) -> frozenset[str]:
    return frozenset(text.split())


def client_object(row: Row[Any]) -> dict[str, Any]:
    return {
        "id": row.id,
        "object": "client",
        "name": row.name,
        "scopes": sorted(scope_set(row.scopes)),
        "created_at": iso(row.created_at),
        "revoked_at": iso(row.revoked_at),
        **{name: getattr(row, name) for name in LIMIT_NAMES},  # None: the default applies
    }


def pairing_code_object(row: Row[Any]) -> dict[str, Any]:
    """An outstanding pairing code as `GET /v1/pairing-codes` and `taskward pairing-codes
    list` show it: what it grants and who made it (null: an operator), never its secret
    nor the secret's hash, so a list shown on a screen gives no code away."""
    return {
        "id": row.id,
        "object": "pairing_code",
        "name": row.name,
        "scopes": sorted(scope_set(row.scopes)),
        "created_at": iso(row.created_at),
        "expires_at": iso(row.expires_at),
        "created_by": row.created_by,
        **{name: getattr(row, name) for name in LIMIT_NAMES},  # None: the default applies
    }
