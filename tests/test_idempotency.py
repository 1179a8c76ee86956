"""`request_digest`: one digest per canonical body, unchanged for bodies stored before."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import msgspec
import pytest

from core.idempotency import request_digest

PATH = "/v1/responses"


def digest_of(text: str) -> str:
    """The digest of a body as the API decodes it (`core.bodies.decode_json`)."""
    return request_digest("POST", PATH, msgspec.json.decode(text))


def digest_before_canonical_numbers(body: Any) -> str:
    """The expression every stored digest was computed with, kept here verbatim."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"POST\n{PATH}\n{canonical}".encode()).hexdigest()


@pytest.mark.parametrize(("whole", "spelled"), [
    ('{"temperature":1}', '{"temperature":1.0}'),
    ('{"seed":100}', '{"seed":1e2}'),
    ('{"temperature":0}', '{"temperature":-0.0}'),
    ('{"input":[{"n":[2]}]}', '{"input":[{"n":[2.000]}]}'),
])
def test_a_whole_number_spelled_as_a_float_has_the_integers_digest(
    whole: str, spelled: str
) -> None:
    assert digest_of(spelled) == digest_of(whole)


def test_different_numbers_still_have_different_digests() -> None:
    assert digest_of('{"temperature":1.5}') != digest_of('{"temperature":1}')
    assert digest_of('{"temperature":1}') != digest_of('{"temperature":"1"}')
    assert digest_of('{"stream":true}') != digest_of('{"stream":1}')


@pytest.mark.parametrize("text", [
    '{"model":"words","input":"h\\u00e9llo","temperature":0.7,"seed":42,"stream":false}',
    '{"input":[{"role":"user","content":"x"}],"metadata":{"b":"2","a":"1"},"top_p":0.25}',
    '{"max_output_tokens":5,"run_at":null,"temperature":1e-7}',
])
def test_a_body_without_whole_number_floats_keeps_its_stored_digest(text: str) -> None:
    body = msgspec.json.decode(text)
    assert request_digest("POST", PATH, body) == digest_before_canonical_numbers(body)
