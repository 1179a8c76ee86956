"""`transitions.encoded`, the event log's JSON: what `json.dumps` writes, but for floats."""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from core.store.transitions import encoded

# Every code point a stored text can hold (a lone surrogate cannot be stored as UTF-8).
_TEXT = st.text(st.characters(codec="utf-8"))
_EXACT_SCALARS = st.none() | st.booleans() | st.integers() | _TEXT


def _data(scalars: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                        | st.dictionaries(_TEXT, inner, max_size=4), max_leaves=20)


def _dumps(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


@given(_data(_EXACT_SCALARS))
def test_data_without_floats_is_written_as_json_dumps_writes_it(data: Any) -> None:
    assert encoded(data) == _dumps(data)


@given(_data(_EXACT_SCALARS | st.floats(allow_nan=False, allow_infinity=False)))
def test_finite_floats_read_back_as_the_same_value(data: Any) -> None:
    assert json.loads(encoded(data)) == data


def test_control_characters_and_non_ascii_text_are_escaped_as_json_dumps_escapes_them() -> None:
    data = {"\x1f\u2028": "é 🙂 \x00 \x7f \"quoted\" back\\slash", 7: [True, None, -0]}
    assert encoded(data) == _dumps(data)


def test_floats_take_their_shortest_form_and_non_finite_ones_are_null() -> None:
    assert encoded([1e16, 1e-5, 0.7, -0.0, math.inf, math.nan]) == \
        "[1e16,0.00001,0.7,-0.0,null,null]"


def test_threads_encode_the_same_data_at_once() -> None:
    """The encoder is made once and shared by every thread that writes events."""
    shared = {"item": {"content": [{"type": "output_text", "text": "w " * 50}] * 20}}
    with ThreadPoolExecutor(8) as pool:
        texts = set(pool.map(lambda _: encoded(shared), range(2000)))
    assert texts == {_dumps(shared)}
