"""Fixtures that load the real default model once per test session."""

from __future__ import annotations

import pytest

from core.engines.base import EngineOptions, ModelFile
from core.engines.llama import LlamaEngine, LlamaLoadedModel
from core.model_files import DEFAULT_MODEL_ID, default_model_source, sha256_of


@pytest.fixture(scope="session")
def default_model_file() -> ModelFile:
    source = default_model_source()
    return ModelFile(DEFAULT_MODEL_ID, source, sha256_of(source))


@pytest.fixture(scope="session")
def llama_engine() -> LlamaEngine:
    return LlamaEngine(EngineOptions(threads=2, cache_size=2))


@pytest.fixture(scope="session")
def default_model(llama_engine: LlamaEngine, default_model_file: ModelFile) -> LlamaLoadedModel:
    return llama_engine.load(default_model_file)
