"""The model registry over HTTP: read with models:read, change with models:admin.

Registration hashes the file (streamed, possibly gigabytes) on the store thread pool;
the path must resolve inside the models directory, links included.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from litestar import delete, get, post
from litestar.params import FromPath, JSONBody
from pydantic import Field, StringConstraints

from core.bodies import StrictBody
from core.model_files import DEFAULT_ENGINE
from core.models_registry import register
from core.objects import model_object
from core.store.database import Database
from core.store.models import get_model, list_models, remove
from handlers.answers import page
from handlers.auth import requires
from handlers.params import model_id_of
from handlers.services import Services
from handlers.threads import blocking

_NO_CONTROL = r"^[^\x00-\x1f\x7f]+$"


class ModelBody(StrictBody):
    path: str = Field(
        min_length=1, max_length=1024, pattern=_NO_CONTROL,
        description="a file inside the models directory (relative to it, or absolute)")
    id: str | None = Field(default=None, min_length=1, max_length=200,
                           description="defaults to the file name without its extension")
    engine: str = Field(default=DEFAULT_ENGINE, min_length=1, max_length=64,
                        pattern=r"^[A-Za-z0-9._:-]+$")
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
    row = await blocking(_register, services.db, services.settings.models_dir, data)
    return model_object(row)


def _register(db: Database, models_dir: Path, data: ModelBody) -> Any:
    return register(db, models_dir, data.path, model_id=data.id, engine=data.engine,
                    metadata=data.metadata)


@delete("/v1/models/{model_id:path}", opt=requires("models:admin"), tags=["models"])
async def model_remove(model_id: FromPath[str], services: Services) -> None:
    """Remove the registry entry (204); the file itself is never deleted."""
    await blocking(remove, services.db, model_id_of(model_id))


ROUTES = [models_list, model_show, model_register, model_remove]
