"""The task list's model filter offers the models tasks still name after their
registry entry is removed (marked "(removed)"), and filtering by one works."""

from __future__ import annotations

import html
import re

import pytest

from core.models_registry import register
from core.settings import Settings
from core.store.database import Database
from core.store.models import remove
from handlers.console import reads
from tests.console.helpers import Console
from tests.store.helpers import new_task

_MODEL_SELECT = re.compile(r'<select name="model">(.*?)</select>', re.S)
_OPTION = re.compile(r'<option value="([^"]*)"( selected)?>([^<]*)</option>')


def _model_options(page: str) -> dict[str, tuple[str, bool]]:
    """The model filter's options: value -> (label, selected), "any" left out."""
    found = _MODEL_SELECT.search(page)
    assert found, "no model filter on the page"
    return {value: (html.unescape(label), bool(selected))
            for value, selected, label in _OPTION.findall(found.group(1)) if value}


def _another_model(db: Database, settings: Settings, name: str) -> str:
    register(db, settings.models_dir, "words.bin", model_id=name, engine="test.words")
    return name


def test_a_removed_models_tasks_are_offered_and_filtered(
    console: Console, db: Database, settings: Settings, model_id: str,
) -> None:
    kept = new_task(db, model_id)
    remove(db, model_id)
    other = new_task(db, _another_model(db, settings, "other-model"))
    options = _model_options(console.page("/console/tasks"))
    assert options[model_id] == (f"{model_id} (removed)", False)
    assert options["other-model"] == ("other-model", False)

    page = console.page(f"/console/tasks?model={model_id}")
    assert kept in page and other not in page
    assert _model_options(page)[model_id] == (f"{model_id} (removed)", True)


def test_registered_models_are_offered_unmarked_without_tasks(
    console: Console, model_id: str,
) -> None:
    assert _model_options(console.page("/console/tasks")) == {model_id: (model_id, False)}


def test_a_filter_by_a_model_beyond_the_scanned_tasks_still_works(
    console: Console, db: Database, settings: Settings, model_id: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    old = new_task(db, model_id)
    remove(db, model_id)
    newer = new_task(db, _another_model(db, settings, "newer-model"))
    monkeypatch.setattr(reads, "MODELS_SCANNED", 1)
    assert model_id not in _model_options(console.page("/console/tasks"))
    page = console.page(f"/console/tasks?model={model_id}")
    assert old in page and newer not in page
    assert _model_options(page)[model_id] == (f"{model_id} (removed)", True)
