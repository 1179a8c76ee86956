"""Console lists read only what they show (docs/operations.md, Operator console): with
more clients than a page shows, the clients page is paged, and task pages name only the
clients of the tasks on them. Both stores."""

from __future__ import annotations

import re

import pytest

from core.clients import IssuedToken
from core.store.clients import create_client
from core.store.database import Database
from handlers.console.reads import PAGE_SIZE
from tests.console.helpers import Console
from tests.store.helpers import new_task

NEXT_PAGE = re.compile(r'href="(/console/clients\?after=[^"]+)">Next page')
BYSTANDERS = PAGE_SIZE + 5


@pytest.fixture
def bystanders(db: Database) -> list[IssuedToken]:
    """More clients than a page shows, none of which owns a task."""
    return [create_client(db, name=f"bystander-{n:03d}", scopes=frozenset({"tasks:read"}))
            for n in range(BYSTANDERS)]


def _client_ids(page: str) -> list[str]:
    return re.findall(r'href="/console/tasks\?client=(cli_[0-9a-z]+)"', page)


def test_the_clients_page_shows_one_page_and_a_link_to_the_next(
    console: Console, bystanders: list[IssuedToken], admin: IssuedToken,
) -> None:
    first = console.page("/console/clients")
    link = NEXT_PAGE.search(first)
    assert link, "no link to the next page"
    second = console.page(link.group(1))
    shown = _client_ids(first) + _client_ids(second)
    assert len(_client_ids(first)) == PAGE_SIZE
    assert NEXT_PAGE.search(second) is None
    every = [token.client_id for token in (*bystanders, admin)]
    assert shown == sorted(every, reverse=True)  # newest first, each once


def test_the_task_list_names_only_the_clients_of_its_tasks(
    console: Console, db: Database, model_id: str, bystanders: list[IssuedToken],
) -> None:
    owner = create_client(db, name="the-owner", scopes=frozenset({"tasks:write"}))
    task_id = new_task(db, model_id, client=owner.client_id)
    listed = console.page("/console/tasks")
    assert task_id in listed and "the-owner" in listed
    assert "bystander-" not in listed


def test_the_task_lists_client_filter_lists_no_clients(
    console: Console, db: Database, model_id: str, bystanders: list[IssuedToken],
) -> None:
    new_task(db, model_id, client=bystanders[0].client_id)
    filtered = console.page(f"/console/tasks?client={bystanders[1].client_id}")
    field = re.search(r"Client (.*?)</label>", filtered, re.S)
    assert field and "<option" not in field.group(1)
    assert f'name="client" value="{bystanders[1].client_id}"' in filtered
    assert "Nothing here." in filtered


def test_a_task_page_names_only_its_own_client(
    console: Console, db: Database, model_id: str, bystanders: list[IssuedToken],
) -> None:
    owner = create_client(db, name="the-owner", scopes=frozenset({"tasks:write"}))
    page = console.page(f"/console/tasks/{new_task(db, model_id, client=owner.client_id)}")
    assert "the-owner" in page and "bystander-" not in page
