"""Outstanding pairing codes, listed and revoked (`GET` and `DELETE /v1/pairing-codes`,
`taskward pairing-codes`); `core.store.clients` makes and redeems them.

Outstanding means the code would still redeem: not used, burnt or expired, and its
maker not revoked. Anything else is not listed and cannot be revoked (`404
pairing_code_not_found`), so a revocation always answers whether it took a code out
of service. A client without `admin` sees and revokes only the codes it made.

A revoked code's row is deleted, in a statement that checks the code is still
outstanding: a redeem racing it either spent the code first (the delete then finds it
used: 404) or finds no row to spend (`invalid_pairing_code`, as for a code never made).

Code ids are random, not in creation order (`core.ids.random_id`), so pages are in
(`created_at`, `id`) order and the cursor carries both of the page's last code: the
next page does not depend on that code still existing, when it has been revoked or
redeemed meanwhile.
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import Row, delete, select, tuple_

from core.clients import is_pairing_code_id
from core.errors import InvalidInput, NotFound
from core.quotas import LIMIT_NAMES
from core.store.clients import live_codes, maker_not_revoked
from core.store.database import Database
from core.tables import pairing_codes

# Every column but the secret's hash, which never leaves the store.
_LISTED = select(
    pairing_codes.c.id, pairing_codes.c.name, pairing_codes.c.scopes,
    pairing_codes.c.created_at, pairing_codes.c.expires_at, pairing_codes.c.created_by,
    *(pairing_codes.c[name] for name in LIMIT_NAMES),
).order_by(pairing_codes.c.created_at.desc(), pairing_codes.c.id.desc())

# `pcc_`, the code's `created_at` in 13 decimal digits (milliseconds, good until the
# year 2286), and its id without `pc_`: an id's shape, as every `after` has.
_CURSOR = re.compile(r"pcc_([0-9]{13})([0-9a-z]{20})")


def outstanding_codes(
    db: Database, *, made_by: str | None, limit: int | None = None, after: str | None = None
) -> tuple[list[Row[Any]], str | None]:
    """A page of outstanding codes, newest first, and the next page's cursor (None on
    the last); `limit` None: all of them. `made_by`: only that client's codes (None:
    everyone's, for an `admin` client or an operator)."""
    query = _LISTED.where(live_codes(db.clock.now_ms()), maker_not_revoked())
    if made_by is not None:
        query = query.where(pairing_codes.c.created_by == made_by)
    if after is not None:
        query = query.where(tuple_(pairing_codes.c.created_at, pairing_codes.c.id)
                            < tuple_(*_position(after)))
    with db.read() as conn:
        rows = list(conn.execute(query if limit is None else query.limit(limit + 1)))
    if limit is None or len(rows) <= limit:
        return rows, None
    last = rows[limit - 1]
    return rows[:limit], f"pcc_{last.created_at:013d}{last.id.removeprefix('pc_')}"


def _position(cursor: str) -> tuple[int, str]:
    """(`created_at`, `id`) of the code a cursor was made after."""
    match = _CURSOR.fullmatch(cursor)
    if match is None:
        raise InvalidInput("validation_error", "after is not a cursor of this list",
                           extra={"field": "after"})
    return int(match.group(1)), "pc_" + match.group(2)


def revoke_pairing_code(db: Database, code_id: str, *, made_by: str | None) -> None:
    """Take an outstanding code out of service for good; `pairing_code_not_found`, with
    nothing changed, when no outstanding code `made_by` that client (None: anyone) has
    this id."""
    if is_pairing_code_id(code_id):
        query = delete(pairing_codes).where(pairing_codes.c.id == code_id, maker_not_revoked())
        if made_by is not None:
            query = query.where(pairing_codes.c.created_by == made_by)
        with db.write() as conn:
            if conn.execute(query.where(live_codes(db.clock.now_ms()))).rowcount:
                return
    raise NotFound("pairing_code_not_found", "no outstanding pairing code has this id (used, "
                   "revoked or expired?); the list of outstanding codes gives their ids")
