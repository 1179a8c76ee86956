"""Ids made here read as Crockford base32 numbers and sort by creation."""

from __future__ import annotations

import random

from core.ids import _ALPHABET, _base32, sortable_id


def _read(digits: str) -> int:
    value = 0
    for digit in digits:
        value = value * 32 + _ALPHABET.index(digit)
    return value


def test_base32_writes_the_low_bits_of_a_value_as_that_many_digits() -> None:
    rng = random.Random(7)
    for width in (1, 2, 9, 10, 16, 20, 26):
        for _ in range(200):
            value = rng.getrandbits(rng.choice([1, 5 * width, 5 * width + 9]))
            digits = _base32(value, width)
            assert len(digits) == width
            assert _read(digits) == value % 32**width


def test_sortable_ids_carry_their_millisecond_and_sort_in_creation_order() -> None:
    later = 2**49  # past any millisecond another test made an id in (ids are monotonic)
    made = [sortable_id("resp", ms) for ms in (later,) * 50 + (later + 1,)]
    assert made == sorted(made) and len(set(made)) == len(made)
    assert {_read(made_id.split("_")[1][:10]) for made_id in made} == {later, later + 1}
