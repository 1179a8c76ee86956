"""The model registry: file entries with verified content digests (files stay on disk)
and upstream entries that name inference servers (docs/upstream.md). The rows are kept
by `core.store.models`.

Registering a file streams it once for its SHA-256; a file for the llama.cpp engine must
have a whole GGUF layout (`core.gguf`). Before a task uses a model the
worker calls `verified_entry` with the entry its claim read (`verified_model_file`
reads it first), which re-checks size and digest (cached per file identity and change
time by `core.model_files`), so a changed file fails the task rather than silently
running a different model; for an upstream entry it returns the servers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from sqlalchemy import Row

from core.engines.base import EngineError, ModelFile, ModelSource, UpstreamModel
from core.engines.registry import is_known_engine, known_engine_names
from core.engines.sampling import SAMPLING_KEYS, sampling_metadata_error
from core.engines.upstream.hosts import UrlRefused, check_allowed, normalized_base_url
from core.engines.upstream.key_envs import KeyEnvRefused, check_key_env
from core.errors import InvalidInput
from core.model_files import (
    DEFAULT_ENGINE,
    DEFAULT_MODEL_METADATA,
    DEFAULT_MODEL_SHA256,
    Progress,
    check_gguf_layout,
    file_digest,
    resolve_inside,
)
from core.store.database import Database
from core.store.models import ModelEntry, insert_model, read_entries

_MODEL_ID = re.compile(r"[A-Za-z0-9._:-]+(/[A-Za-z0-9._:-]+)*")
MAX_MODEL_ID = 200
UPSTREAM_ENGINE = "openai"
DEFAULT_MAX_CONCURRENCY = 16
DEFAULT_TIMEOUT_SECONDS = 60.0
MAX_CONCURRENCY_LIMIT = 4096
MAX_BASE_URLS = 16
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def could_be_model_id(text: str) -> bool:
    """1..200 of `[A-Za-z0-9._:/-]`, a `/` only between two names (`org/model`): an id
    with an empty segment could be registered but never reached by its URL."""
    return len(text) <= MAX_MODEL_ID and _MODEL_ID.fullmatch(text) is not None


def register(
    db: Database,
    models_dir: Path,
    path: str | Path | None,
    *,
    model_id: str | None = None,
    engine: str,
    metadata: dict[str, str] | None = None,
    progress: Progress | None = None,
) -> Row[Any]:
    """Add an entry for a file inside `models_dir`; an id already taken is a conflict.
    `progress` is told how far the file's hash has got (`core.model_files.Progress`).

    The API (an entry without `upstream`) and `taskward models add` both call this, so
    they refuse alike: the `openai` engine without servers is `upstream_required`, no
    `path` is `validation_error`, an id given but not an id (empty, say) is
    `invalid_model_id`; only an id not given defaults to the file's name. A file for
    the llama.cpp engine (the default, `DEFAULT_ENGINE`) that is not a whole GGUF file
    is `model_file_invalid`; another engine's files are that engine's business.

    The bundled default model's file (known by its digest) registered without sampling
    keys gets the values its authors recommend (`_entry_metadata`).
    """
    if engine == UPSTREAM_ENGINE:
        raise InvalidInput("upstream_required",
                           f"the {UPSTREAM_ENGINE} engine needs an upstream object, not a file",
                           extra={"field": "engine"})
    if path is None:
        raise InvalidInput("validation_error", "path (a model file) or upstream is required",
                           extra={"field": "path"})
    if (problem := sampling_metadata_error(metadata or {})) is not None:
        raise InvalidInput("invalid_model_metadata", problem, extra={"field": "metadata"})
    real = resolve_inside(models_dir, path)
    model_id = _checked_id(real.stem if model_id is None else model_id)
    if not is_known_engine(engine):
        raise InvalidInput("unknown_engine", "no engine of that name is installed; "
                           f"installed: {', '.join(known_engine_names())} (plug-ins add "
                           "theirs through TASKWARD_ENGINE_MODULES)", extra={"field": "engine"})
    digest = file_digest(real, progress)  # first: one still being copied in is model_file_changed
    if engine == DEFAULT_ENGINE:
        check_gguf_layout(real, path)
    stored_path = str(real.relative_to(models_dir.resolve()))
    return insert_model(db, {
        "id": model_id, "engine": engine, "path": stored_path,
        "size_bytes": digest.size, "sha256": digest.sha256,
        "metadata_json": json.dumps(_entry_metadata(metadata or {}, digest.sha256),
                                    separators=(",", ":"))})


def _entry_metadata(metadata: dict[str, str], sha256: str) -> dict[str, str]:
    """The metadata an entry is stored with: as given, but the bundled default model's
    file given no sampling key gets `DEFAULT_MODEL_METADATA` beside what was given,
    whoever registers it (`taskward run`, `taskward models add`, `POST /v1/models`):
    without them "Say hello." loops to the token limit. A sampling key given is the
    registrant's own choice, and then none of the defaults is added."""
    if sha256 != DEFAULT_MODEL_SHA256 or any(key in metadata for key in SAMPLING_KEYS):
        return metadata
    return {**DEFAULT_MODEL_METADATA, **metadata}


def _checked_id(model_id: str) -> str:
    if not could_be_model_id(model_id):
        raise InvalidInput("invalid_model_id", "a model id is 1..200 of [A-Za-z0-9._:/-], "
                           "with `/` only between names",
                           extra={"field": "id"})
    return model_id


def register_upstream(
    db: Database,
    model_id: str,
    *,
    base_urls: list[str],
    model: str,
    api_key_env: str | None = None,
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    metadata: dict[str, str] | None = None,
    allowed_hosts: tuple[str, ...] = (),
    allowed_key_envs: tuple[str, ...] = (),
) -> Row[Any]:
    """Add an upstream entry: servers speaking OpenAI's Chat Completions at `base_urls`.

    Refused (422, nothing stored): a URL that is not http(s)…/v1 or whose host
    `allowed_hosts` does not match, a `max_concurrency` outside 1..4096, an
    `api_key_env` that is not a variable name, names taskward's or libpq's own
    variables or is not matched by `allowed_key_envs` (`invalid_api_key_env`,
    `core.engines.upstream.key_envs`), a `model` that is not 1..200 printable
    characters (`invalid_upstream_model`). The API and `taskward models add-upstream`
    leave these checks to this function, so both answer the same codes. The key itself
    is never read here.
    """
    urls = _checked_urls(base_urls, allowed_hosts)
    if not 1 <= max_concurrency <= MAX_CONCURRENCY_LIMIT:
        raise InvalidInput("invalid_max_concurrency",
                           f"max_concurrency must be within 1..{MAX_CONCURRENCY_LIMIT}",
                           extra={"field": "upstream.max_concurrency"})
    if not 0 < timeout_seconds <= 3600:
        raise InvalidInput("invalid_timeout", "timeout_seconds must be within (0, 3600]",
                           extra={"field": "upstream.timeout_seconds"})
    if api_key_env is not None:
        _check_api_key_env(api_key_env, allowed_key_envs)
    if not model or len(model) > 200 or not model.isprintable():
        raise InvalidInput("invalid_upstream_model", "the upstream model name is 1..200 "
                           "printable characters", extra={"field": "upstream.model"})
    upstream = {"base_urls": urls, "model": model, "api_key_env": api_key_env,
                "timeout_seconds": timeout_seconds}
    return insert_model(db, {
        "id": _checked_id(model_id), "engine": UPSTREAM_ENGINE, "path": None,
        "size_bytes": None, "sha256": None,
        "metadata_json": json.dumps(metadata or {}, separators=(",", ":")),
        "upstream_json": json.dumps(upstream, separators=(",", ":")),
        "max_concurrency": max_concurrency})


def _check_api_key_env(name: str, allowed_key_envs: tuple[str, ...]) -> None:
    try:
        if not _ENV_NAME.match(name):
            raise KeyEnvRefused("api_key_env must be an environment variable name")
        check_key_env(name, allowed_key_envs)
    except KeyEnvRefused as exc:
        raise InvalidInput("invalid_api_key_env", exc.message,
                           extra={"field": "upstream.api_key_env"}) from None


def _checked_urls(base_urls: list[str], allowed_hosts: tuple[str, ...]) -> list[str]:
    if not 1 <= len(base_urls) <= MAX_BASE_URLS:
        raise InvalidInput("invalid_upstream_url", f"1..{MAX_BASE_URLS} base URLs",
                           extra={"field": "upstream.base_urls"})
    urls: list[str] = []
    for url in base_urls:
        try:
            normal = normalized_base_url(url)
            check_allowed(normal, allowed_hosts)
        except UrlRefused as exc:
            raise InvalidInput(exc.code, exc.message,
                               extra={"field": "upstream.base_urls"}) from None
        if normal not in urls:
            urls.append(normal)
    return urls


def upstream_of(entry: ModelEntry) -> UpstreamModel | None:
    """The servers of an upstream entry; None for a file entry."""
    if entry.upstream_json is None:
        return None
    spec = json.loads(entry.upstream_json)
    return UpstreamModel(model_id=entry.id, base_urls=tuple(spec["base_urls"]),
                         model=spec["model"], api_key_env=spec.get("api_key_env"),
                         max_concurrency=entry.max_concurrency or DEFAULT_MAX_CONCURRENCY,
                         timeout_seconds=float(spec["timeout_seconds"]))


def verified_model_file(
    db: Database, models_dir: Path, model_id: str
) -> tuple[str, ModelSource]:
    """`verified_entry` of the model's entry as stored now."""
    found = read_entries(db, [model_id]).get(model_id)
    return verified_entry(models_dir, found)


def verified_entry(models_dir: Path, entry: ModelEntry | None) -> tuple[str, ModelSource]:
    """(engine name, model file or upstream servers) for a task whose model's registry
    entry is `entry` (None: no longer registered), or a non-retryable `EngineError`.

    The entry is read by the caller (a worker: in the claim's transaction); the file is
    checked here, now. A file swapped after this check is caught when it is loaded: the
    engine checks the digest again on the descriptor it loads from
    (`core.model_files.hashed_file`). Codes: `model_not_found` (entry gone),
    `model_file_missing`, `model_digest_mismatch`, `model_file_changed` (it changed
    while it was hashed).
    """
    if entry is None:
        raise EngineError("model_not_found", "the task's model is no longer registered",
                          retryable=False)
    upstream = upstream_of(entry)
    if upstream is not None:
        return entry.engine, upstream
    try:
        real = resolve_inside(models_dir, entry.path or "")  # a file entry has a path
        digest = file_digest(real)
    except InvalidInput as exc:  # vanished, looping, swapped for another kind of file
        raise EngineError(exc.code, exc.message, retryable=False) from None
    if digest.size != entry.size_bytes or digest.sha256 != entry.sha256:
        raise EngineError("model_digest_mismatch",
                          "the model file's content no longer matches its registered digest",
                          retryable=False)
    return entry.engine, ModelFile(model_id=entry.id, path=real, sha256=entry.sha256,
                                   metadata=json.loads(entry.metadata_json or "{}"))
