"""A model file llama.cpp cannot load: the client is told which model and a fixed reason;
the binding's own words, with the server's path, go to the operator's log only."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from core.engines.base import EngineError, EngineOptions, ModelFile
from core.engines.llama import LlamaEngine
from core.model_files import sha256_of


def test_a_model_that_cannot_load_tells_the_client_no_path_and_no_binding_advice(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"hello, not a gguf\n")

    with caplog.at_level(logging.WARNING, logger="core.engines.llama"), \
            pytest.raises(EngineError) as caught:
        LlamaEngine(EngineOptions()).load(ModelFile("bad", bad, sha256_of(bad)))

    message = caught.value.message
    assert caught.value.code == "model_load_failed"
    assert message == ("cannot load model 'bad': the model file could not be loaded "
                       "(not a valid GGUF file, or not enough memory)")
    assert str(tmp_path) not in message and "verbose" not in message
    assert str(bad) in caplog.text  # the operator learns which file, and the binding's why
