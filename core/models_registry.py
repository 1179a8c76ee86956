"""The model registry: entries with verified content digests; files stay on disk.
The rows are kept by `core.store.models`.

Registering streams the file once for its SHA-256. Before a task uses a model the
worker calls `verified_model_file`, which re-checks size and digest (cached per file
identity and change time by `core.model_files`), so a changed file fails the task
rather than silently running a different model.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from sqlalchemy import Row

from core.engines.base import EngineError, ModelFile
from core.engines.registry import is_known_engine
from core.errors import InvalidInput
from core.model_files import file_digest, resolve_inside
from core.store.database import Database
from core.store.models import find_model, insert_model

_MODEL_ID = re.compile(r"[A-Za-z0-9._:-]+(/[A-Za-z0-9._:-]+)*")
MAX_MODEL_ID = 200


def could_be_model_id(text: str) -> bool:
    """1..200 of `[A-Za-z0-9._:/-]`, a `/` only between two names (`org/model`): an id
    with an empty segment could be registered but never reached by its URL."""
    return len(text) <= MAX_MODEL_ID and _MODEL_ID.fullmatch(text) is not None


def register(
    db: Database,
    models_dir: Path,
    path: str | Path,
    *,
    model_id: str | None = None,
    engine: str,
    metadata: dict[str, str] | None = None,
) -> Row[Any]:
    """Add an entry for a file inside `models_dir`; an id already taken is a conflict."""
    real = resolve_inside(models_dir, path)
    model_id = model_id or real.stem
    if not could_be_model_id(model_id):
        raise InvalidInput("invalid_model_id", "a model id is 1..200 of [A-Za-z0-9._:/-], "
                           "with `/` only between names",
                           extra={"field": "id"})
    if not is_known_engine(engine):
        raise InvalidInput("unknown_engine", "no engine of that name is installed",
                           extra={"field": "engine"})
    digest = file_digest(real)
    stored_path = str(real.relative_to(models_dir.resolve()))
    return insert_model(db, {
        "id": model_id, "engine": engine, "path": stored_path,
        "size_bytes": digest.size, "sha256": digest.sha256,
        "metadata_json": json.dumps(metadata or {}, separators=(",", ":"))})


def verified_model_file(db: Database, models_dir: Path, model_id: str) -> tuple[str, ModelFile]:
    """(engine name, model file) for a task, or a non-retryable `EngineError`.

    Codes: `model_not_found` (entry gone), `model_file_missing`, `model_digest_mismatch`.
    """
    row = find_model(db, model_id)
    if row is None:
        raise EngineError("model_not_found", "the task's model is no longer registered",
                          retryable=False)
    try:
        real = resolve_inside(models_dir, row.path)
        digest = file_digest(real)
    except InvalidInput as exc:  # vanished, looping, swapped for another kind of file
        raise EngineError(exc.code, exc.message, retryable=False) from None
    if digest.size != row.size_bytes or digest.sha256 != row.sha256:
        raise EngineError("model_digest_mismatch",
                          "the model file's content no longer matches its registered digest",
                          retryable=False)
    return row.engine, ModelFile(model_id=row.id, path=real, sha256=row.sha256)
