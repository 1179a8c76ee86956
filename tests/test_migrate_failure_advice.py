"""A migration PostgreSQL refuses for the database's privileges or configuration says
what to grant or set, not "run the version that wrote it … and report this line"."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy.engine import make_url

from core.errors import SchemaMismatch
from tests.databases import migrate_to_head, pg_admin_conninfo, private_pg_database


@pytest.fixture
def non_owner_url() -> Iterator[str]:
    """A database owned by the admin and a role that may connect to it but, as
    PostgreSQL 15 has it for a non-owner, not create in its schema public."""
    role = f"taskward_test_role_{secrets.token_hex(4)}"
    with private_pg_database() as url:
        admin_url = make_url(url)
        with psycopg.connect(pg_admin_conninfo(), autocommit=True) as admin:
            admin.execute(f"CREATE ROLE {role} LOGIN")
        try:
            with psycopg.connect(pg_admin_conninfo().rsplit("/", 1)[0] + "/"
                                 + str(admin_url.database), autocommit=True) as admin:
                admin.execute(f"REVOKE CREATE ON SCHEMA public FROM PUBLIC, {role}")
            yield admin_url.set(username=role).render_as_string(hide_password=False)
        finally:
            with psycopg.connect(pg_admin_conninfo(), autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{admin_url.database}" WITH (FORCE)')
                admin.execute(f"DROP ROLE IF EXISTS {role}")


def test_a_role_without_create_on_the_schema_is_told_to_get_it(non_owner_url: str) -> None:
    with pytest.raises(SchemaMismatch) as refused:
        migrate_to_head(non_owner_url)
    message = refused.value.message
    assert "InsufficientPrivilege" in message, message
    assert "grant this role CREATE on the schema" in message, message
    assert "a database the role owns" in message, message
    assert "report this line" not in message, message


def test_a_search_path_naming_no_schema_is_told_to_be_fixed() -> None:
    with private_pg_database() as url:
        with pytest.raises(SchemaMismatch) as refused:
            migrate_to_head(f"{url}?options=-csearch_path%3Dtaskward_test_nosuch")
    message = refused.value.message
    assert "InvalidSchemaName" in message, message
    assert "search_path" in message and "report this line" not in message, message
