"""Engine factories by name, and one engine instance per name per process.

Built-in engines are named here and imported on first use (the llama engine pulls a
native library that the API never needs); plug-ins (`TASKWARD_ENGINE_MODULES`) and
tests register factories of their own. Instances are cached because an engine owns a
model cache.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable

from core.engines.base import Engine, EngineFactory, EngineOptions
from core.errors import DomainError

# Engine name -> "module:factory", imported when the engine is first asked for.
_BUILTIN: dict[str, str] = {"llama.cpp": "core.engines.llama:LlamaEngine",
                             "openai": "core.engines.upstream.engine:OpenAIEngine"}
_factories: dict[str, EngineFactory] = {}
_instances: dict[str, Engine] = {}
_lock = threading.Lock()


def register_engine(name: str, factory: EngineFactory) -> None:
    with _lock:
        _factories[name] = factory
        _instances.pop(name, None)


def import_engine_modules(names: list[str]) -> None:
    """Import plug-in modules named by `TASKWARD_ENGINE_MODULES`; each registers engines."""
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise DomainError(
                "engine_module_missing",
                f"engine module {name!r} (TASKWARD_ENGINE_MODULES) cannot be imported: {exc}",
            ) from None


def is_known_engine(name: str) -> bool:
    """Whether a model entry may name `name`: a built-in engine (known without importing
    its native library) or one a plug-in of `TASKWARD_ENGINE_MODULES` registered."""
    return name in _BUILTIN or name in _factories


def known_engine_names() -> list[str]:
    """The names `is_known_engine` accepts, sorted: what a refusal tells the operator
    to choose from (an engine name is no secret)."""
    return sorted({*_BUILTIN, *_factories})


def engine_named(name: str, options: Callable[[], EngineOptions]) -> Engine:
    """The process's engine called `name`; `unknown_engine` when none is registered.

    `options()` is called only when the engine is made, once per process: a worker asks
    for its engine at every task's start, and building the options each time was ~2 %
    of a no-op task's CPU."""
    with _lock:
        engine = _instances.get(name)
        if engine is None:
            factory = _factories.get(name) or _builtin_factory(name)
            if factory is None:
                raise DomainError("unknown_engine", f"no engine named {name!r}")
            engine = _instances[name] = factory(options())
        return engine


def _builtin_factory(name: str) -> EngineFactory | None:
    where = _BUILTIN.get(name)
    if where is None:
        return None
    module, attribute = where.split(":")
    factory: EngineFactory = getattr(importlib.import_module(module), attribute)
    _factories[name] = factory
    return factory
