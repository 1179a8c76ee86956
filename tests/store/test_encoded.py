"""`transitions.encoded`, the event log's JSON: byte for byte what `json.dumps` writes."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from core.store.transitions import encoded

_SCALARS = (st.none() | st.booleans() | st.integers() | st.floats() | st.text())
_DATA = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(), inner, max_size=4), max_leaves=20)


def _dumps(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


@given(_DATA)
def test_encoded_writes_what_json_dumps_writes(data: Any) -> None:
    assert encoded(data) == _dumps(data)


def test_keys_that_are_not_strings_and_odd_floats_are_written_as_json_dumps_writes_them() -> None:
    data = {1: "a", 2.5: None, None: True, False: [float("inf"), float("nan"), -0.0, 1e-7],
            "\x1f\u2028": "é 🙂 \x00"}
    assert encoded(data) == _dumps(data)


def test_threads_encode_the_same_data_at_once() -> None:
    """The encoder is made once and shared: the same object encoded on many threads at
    once is no circular reference to it."""
    shared = {"item": {"content": [{"type": "output_text", "text": "w " * 50}] * 20}}
    with ThreadPoolExecutor(8) as pool:
        texts = set(pool.map(lambda _: encoded(shared), range(2000)))
    assert texts == {_dumps(shared)}
