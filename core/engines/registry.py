"""Engine factories by name, and one engine instance per name per process.

Product engines register themselves here at import; tests may register deterministic
engines of their own. Instances are cached because an engine owns a model cache.
"""

from __future__ import annotations

import importlib
import threading

from core.engines.base import Engine, EngineFactory, EngineOptions
from core.errors import DomainError

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


def known_engines() -> list[str]:
    _import_builtin_engines()
    return sorted(_factories)


def engine_named(name: str, options: EngineOptions) -> Engine:
    """The process's engine called `name`; `unknown_engine` when none is registered."""
    _import_builtin_engines()
    with _lock:
        engine = _instances.get(name)
        if engine is None:
            factory = _factories.get(name)
            if factory is None:
                raise DomainError("unknown_engine", f"no engine named {name!r}")
            engine = _instances[name] = factory(options)
        return engine


def _import_builtin_engines() -> None:
    # Imported lazily: the llama engine pulls a native library that the API never needs.
    import core.engines.llama  # noqa: F401
