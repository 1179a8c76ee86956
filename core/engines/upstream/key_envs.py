"""Which environment variables an upstream entry's `api_key_env` may name.

A sweeper sends the variable's value as a bearer token to the entry's servers, which a
client with `models:admin` chooses: naming `TASKWARD_DATABASE_URL` would send it the
store's password. So taskward's own settings (`TASKWARD_*`) and libpq's variables
(`PG*`: PGPASSWORD, PGPASSFILE, PGSERVICEFILE… hold the store's credentials) are never
sent, in any case; `TASKWARD_UPSTREAM_KEY_ENVS` (name patterns) narrows the rest. Like
the allowed hosts (`hosts.py`) this is checked at registration and again before every
attempt: an entry may have been stored before the rule or the setting.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

# Upper case: a name is compared in upper case, so `taskward_database_url` is refused
# too (settings are read in any case, `core.settings`).
FORBIDDEN_PREFIXES = ("TASKWARD_", "PG")


class KeyEnvRefused(ValueError):
    """An `api_key_env` taskward will not read; the message says why, without a value."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def check_key_env(name: str, patterns: tuple[str, ...]) -> None:
    """`KeyEnvRefused` when `name` is one of taskward's or libpq's variables, or when
    `patterns` are given and none matches it (`*` and `?` wildcards, case as written:
    variable names are case-sensitive); no patterns allow every other name."""
    if name.upper().startswith(FORBIDDEN_PREFIXES):
        raise KeyEnvRefused("api_key_env must not name taskward's settings (TASKWARD_*) or "
                            "libpq's variables (PG*): they hold the store's credentials")
    if patterns and not any(fnmatchcase(name, pattern) for pattern in patterns):
        raise KeyEnvRefused(f"api_key_env {name} is not in TASKWARD_UPSTREAM_KEY_ENVS")
