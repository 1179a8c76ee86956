"""`core.engines.registry`: one engine per name per process, made with the process's options."""

from __future__ import annotations

from core.engines.base import EngineOptions, LoadedModel, ModelSource
from core.engines.registry import engine_named, register_engine


class _Recorded:
    """An engine that only remembers the options it was made with (it runs nothing)."""

    name = "test.recorded"

    def __init__(self, options: EngineOptions) -> None:
        self.options = options

    def load(self, model: ModelSource) -> LoadedModel:
        raise NotImplementedError


def test_the_options_are_made_once_when_the_engine_is_first_asked_for() -> None:
    register_engine(_Recorded.name, _Recorded)
    made: list[EngineOptions] = []

    def options() -> EngineOptions:
        made.append(EngineOptions(threads=3))
        return made[-1]

    first = engine_named(_Recorded.name, options)
    again = engine_named(_Recorded.name, options)

    assert again is first
    assert isinstance(first, _Recorded) and first.options.threads == 3
    assert len(made) == 1
