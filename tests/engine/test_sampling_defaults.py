"""Sampling defaults from the model entry: what a request leaves unset, the entry sets."""

from __future__ import annotations

import json
from typing import Any

import pytest

from core.engines.base import GenerationRequest
from core.engines.llama_native import llama_cpp
from core.engines.llama_sampling import Sampling
from core.engines.sampling import sampling_metadata_error, with_model_defaults
from core.errors import InvalidInput
from core.model_files import install_default_model
from core.models_registry import register
from core.settings import Settings
from core.states import OnRestart
from core.store.births import NewTask
from core.store.database import Database
from core.store.new_tasks import enqueue
from tests.scheduler.helpers import run_pass

ENTRY = {"temperature": "0.7", "top_p": "0.8", "repeat_penalty": "1.3", "top_k": "40"}
HELLO = [{"role": "user", "content": "Say hello."}]


def test_unset_fields_take_the_entry_values_and_set_fields_win() -> None:
    request = GenerationRequest(HELLO, top_p=0.5)

    merged = with_model_defaults(request, ENTRY)

    assert (merged.temperature, merged.top_p, merged.repeat_penalty, merged.top_k) == (
        0.7, 0.5, 1.3, 40)


def test_temperature_zero_in_the_request_stays_greedy() -> None:
    assert with_model_defaults(GenerationRequest(HELLO, temperature=0), ENTRY).temperature == 0


@pytest.mark.parametrize("metadata", [
    {"temperature": "hot"}, {"top_p": "0"}, {"repeat_penalty": "-1"}, {"top_k": "2.5"},
    {"temperature": "nan"},
    # Near zero, llama.cpp's float32 divides by 0 and the entry's tasks answer nothing.
    {"repeat_penalty": "1e-300"}, {"repeat_penalty": "1e-45"}, {"repeat_penalty": "0.09"},
    # float() reads these as 1.0 and 0.5; only plain ASCII decimals are numbers here.
    {"temperature": "0_1"}, {"temperature": "\u0661"}, {"temperature": " 0.5\n"},
    {"top_p": "0x1p-1"}, {"top_k": "1_000"},
])
def test_an_entry_with_unusable_sampling_metadata_is_refused(
    db: Database, settings: Settings, metadata: dict[str, str]
) -> None:
    (settings.models_dir / "m.gguf").write_bytes(b"not read: refused before")

    with pytest.raises(InvalidInput) as caught:
        register(db, settings.models_dir, "m.gguf", engine="llama.cpp", metadata=metadata)

    assert caught.value.code == "invalid_model_metadata"


@pytest.mark.parametrize("metadata", [
    {"temperature": "0.5"}, {"temperature": "+1"}, {"temperature": "1e-45"}, {"top_p": "1E-2"},
    {"repeat_penalty": "0.1"}, {"repeat_penalty": "10"}, {"top_k": "40"}, {"top_k": "-0"},
])
def test_plain_decimals_in_range_are_usable_sampling_metadata(metadata: dict[str, str]) -> None:
    assert sampling_metadata_error(metadata) is None


def test_an_entry_temperature_next_to_zero_samples_greedily() -> None:
    merged = with_model_defaults(GenerationRequest(HELLO), {"temperature": "1e-45"})

    assert Sampling.of(merged, seed=None).greedy


class _RecordingSampler(llama_cpp.LlamaSampler):
    """The real sampler chain, recording the links the engine adds (a spy, not a fake)."""

    links: list[tuple[str, tuple[Any, ...]]] = []

    def add_temp(self, t: float) -> None:
        self.links.append(("temp", (t,)))
        super().add_temp(t)

    def add_top_p(self, p: float, min_keep: int) -> None:
        self.links.append(("top_p", (p,)))
        super().add_top_p(p, min_keep)

    def add_top_k(self, k: int) -> None:
        self.links.append(("top_k", (k,)))
        super().add_top_k(k)

    def add_penalties(self, last_n: int, repeat: float, freq: float, present: float) -> None:
        self.links.append(("repeat_penalty", (repeat,)))
        super().add_penalties(last_n, repeat, freq, present)

    def add_greedy(self) -> None:
        self.links.append(("greedy", ()))
        super().add_greedy()


@pytest.mark.model
def test_a_task_without_sampling_fields_samples_with_the_entry_defaults(
    db: Database, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = install_default_model(settings.models_dir)
    register(db, settings.models_dir, path, model_id="smol", engine="llama.cpp", metadata=ENTRY)
    body = {"model": "smol", "input": "Say hello.", "max_output_tokens": 3}
    enqueue(db, NewTask(client_id="client-a", model="smol", request_json=json.dumps(body),
                        on_restart=OnRestart.RETRY))
    monkeypatch.setattr(llama_cpp, "LlamaSampler", _RecordingSampler)  # the shared binding
    _RecordingSampler.links = []

    assert run_pass(db, settings)["completed"] == 1

    links = set(_RecordingSampler.links)
    assert {("temp", (0.7,)), ("top_p", (0.8,)), ("top_k", (40,))} <= links
    assert any(name == "repeat_penalty" and abs(args[0] - 1.3) < 1e-6 for name, args in links)
    assert ("greedy", ()) not in links

