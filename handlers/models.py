"""The model registry over HTTP: read with models:read, change with models:admin.

A file entry: registration hashes the file (streamed, possibly gigabytes) on the store
thread pool; the path must resolve inside the models directory, links included. An
upstream entry (`engine: "openai"`, `upstream`): servers checked by the registry
against `TASKWARD_UPSTREAM_ALLOWED_HOSTS` (docs/upstream.md).
"""

from __future__ import annotations

from typing import Annotated, Any

from litestar import delete, get, post
from litestar.params import FromPath, JSONBody
from pydantic import Field, StringConstraints

from core.bodies import NO_CONTROL, StrictBody
from core.errors import InvalidInput
from core.model_files import DEFAULT_ENGINE
from core.models_registry import (
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_TIMEOUT_SECONDS,
    UPSTREAM_ENGINE,
    register,
    register_upstream,
)
from core.objects import model_object
from core.settings import Settings
from core.store.database import Database
from core.store.models import get_model, list_models, remove
from handlers.answers import page
from handlers.auth import requires
from handlers.params import model_id_of
from handlers.services import Services
from handlers.threads import blocking, lengthy


class UpstreamBody(StrictBody):
    """Inference servers speaking OpenAI's Chat Completions. Types and the number of
    URLs are checked here; the registry checks each value (a URL's length and form, the
    model name, the ranges) and answers with its own codes, as it does for `taskward
    models add-upstream`."""

    base_urls: list[str] = Field(min_length=1, max_length=16,
                                 description="1..16 URLs, each ending in /v1")
    model: str = Field(description="the upstream's model name, 1..200 printable characters")
    api_key_env: str | None = Field(
        default=None,
        description="the environment variable holding the upstream's bearer key")
    max_concurrency: int = Field(default=DEFAULT_MAX_CONCURRENCY,
                                 description="attempts in flight fleet-wide, 1..4096")
    timeout_seconds: float = Field(default=DEFAULT_TIMEOUT_SECONDS,
                                   description="connect/read timeout, (0, 3600]")


class ModelBody(StrictBody):
    """`id` and `engine` are checked by the registry (`invalid_model_id`,
    `unknown_engine`), as for `taskward models add`."""

    path: str | None = Field(
        default=None, min_length=1, max_length=1024, pattern=NO_CONTROL,
        description="a file inside the models directory (relative to it, or absolute)")
    id: str | None = Field(default=None,
                           description="1..200 of [A-Za-z0-9._:/-]; defaults to the file "
                                       "name without its extension")
    engine: str | None = Field(default=None,
                               description=f"default {DEFAULT_ENGINE}; {UPSTREAM_ENGINE} "
                                           "with `upstream`")
    upstream: UpstreamBody | None = None
    metadata: dict[Annotated[str, StringConstraints(max_length=64)],
                   Annotated[str, StringConstraints(max_length=512)]] = Field(
        default_factory=dict, max_length=16)


@get("/v1/models", opt=requires("models:read"), tags=["models"])
async def models_list(services: Services) -> dict[str, Any]:
    rows = await blocking(list_models, services.db)
    return page([model_object(row) for row in rows], None)


@get("/v1/models/{model_id:path}", opt=requires("models:read"), tags=["models"])
async def model_show(model_id: FromPath[str], services: Services) -> dict[str, Any]:
    return model_object(await blocking(get_model, services.db, model_id_of(model_id)))


@post("/v1/models", opt=requires("models:admin"), status_code=201, tags=["models"])
async def model_register(data: JSONBody[ModelBody], services: Services) -> dict[str, Any]:
    """Register a file under the models directory; the service computes its SHA-256."""
    row = await lengthy(_register, services.db, services.settings, data)  # hashes the file
    return model_object(row)


def _register(db: Database, settings: Settings, data: ModelBody) -> Any:
    if data.upstream is not None:
        return _register_upstream(db, settings, data, data.upstream)
    engine = DEFAULT_ENGINE if data.engine is None else data.engine
    return register(db, settings.models_dir, data.path, model_id=data.id, engine=engine,
                    metadata=data.metadata)


def _register_upstream(
    db: Database, settings: Settings, data: ModelBody, upstream: UpstreamBody
) -> Any:
    if data.path is not None:
        raise InvalidInput("validation_error", "an entry has a path or an upstream, not both",
                           extra={"field": "path"})
    if data.engine not in (None, UPSTREAM_ENGINE):
        raise InvalidInput("unknown_engine",
                           f"an upstream entry is served by the {UPSTREAM_ENGINE!r} engine",
                           extra={"field": "engine"})
    if data.id is None:
        raise InvalidInput("validation_error", "an upstream entry needs an id",
                           extra={"field": "id"})
    return register_upstream(db, data.id, base_urls=list(upstream.base_urls),
                             model=upstream.model, api_key_env=upstream.api_key_env,
                             max_concurrency=upstream.max_concurrency,
                             timeout_seconds=upstream.timeout_seconds, metadata=data.metadata,
                             allowed_hosts=settings.upstream_host_patterns,
                             allowed_key_envs=settings.upstream_key_env_patterns)


@delete("/v1/models/{model_id:path}", opt=requires("models:admin"), tags=["models"])
async def model_remove(model_id: FromPath[str], services: Services) -> None:
    """Remove the registry entry (204); the file itself is never deleted."""
    await blocking(remove, services.db, model_id_of(model_id))


ROUTES = [models_list, model_show, model_register, model_remove]
