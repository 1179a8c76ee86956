"""What a body may cost the API: the nesting check reads bytes, not containers, and
the routes anyone may post to take a few kilobytes at most.

A megabyte of `[[],[],...]` to `POST /v1/pair` took 0.6-4.9 s of the event loop, a
megabyte of form fields to the console's login 1-2 s, whoever sent them.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from litestar.testing import TestClient

from core.bodies import MAX_JSON_DEPTH, PUBLIC_BODY_BYTES, decode_json
from core.errors import DomainError

SIBLING_LISTS = b"[" + b"[]," * 349_000 + b"[]]"  # a megabyte, two levels deep
DEEP_SIBLINGS = b"[" + b",".join([b"[" * 63 + b"]" * 63] * 8000) + b"]"  # 64 levels, 8000 times


def nested(depth: int, inner: bytes = b"1") -> bytes:
    """`depth` containers, objects and lists in turn, around `inner`."""
    opening = b"".join(b'{"k":' if level % 2 else b"[" for level in range(depth))
    closing = b"".join(b"}" if level % 2 else b"]" for level in reversed(range(depth)))
    return opening + inner + closing


def least_cpu_seconds(decode: Callable[[bytes], Any], body: bytes) -> float:
    """The least CPU time of three decodes of `body`, the collector off (its passes over a
    megabyte of new lists would be measured, not the decode)."""
    gc.collect()
    gc.disable()
    try:
        return min(_cpu_seconds(decode, body) for _ in range(3))
    finally:
        gc.enable()


def _cpu_seconds(decode: Callable[[bytes], Any], body: bytes) -> float:
    started = time.process_time()
    decode(body)
    return time.process_time() - started


@pytest.mark.parametrize("body", [SIBLING_LISTS, DEEP_SIBLINGS], ids=["siblings", "deep"])
def test_checking_the_depth_costs_less_than_decoding_twice(body: bytes) -> None:
    """A walk of every container in Python cost eleven decodes of `SIBLING_LISTS`."""
    assert decode_json(body) is not None
    assert least_cpu_seconds(decode_json, body) < 3 * least_cpu_seconds(
        msgspec.json.decode, body)


@pytest.mark.parametrize("body", [
    nested(MAX_JSON_DEPTH),
    nested(MAX_JSON_DEPTH, b'"' + b"[{" * 100 + b'"'),  # brackets in a string are text
    nested(MAX_JSON_DEPTH, b'"\\\\"'),  # an escaped backslash ends no string early
    nested(MAX_JSON_DEPTH, b'"\\"[[[[\\\\\\"{{{{"'),  # nor does an escaped quote
    b"[" + b"[]," * 200 + b"[]]",
], ids=["at-the-limit", "brackets-in-a-string", "escaped-backslash", "escaped-quote",
        "many-shallow"])
def test_a_body_nested_at_most_the_limit_is_decoded(body: bytes) -> None:
    assert decode_json(body) == msgspec.json.decode(body)


@pytest.mark.parametrize("body", [
    nested(MAX_JSON_DEPTH + 1),
    nested(MAX_JSON_DEPTH + 1, b'"]]]]}}}}"'),  # closing brackets in a string close nothing
    b"[" + nested(MAX_JSON_DEPTH) + b"," + nested(2) + b"]",
    b'["\\\\", ' + nested(MAX_JSON_DEPTH) + b"]",
], ids=["one-past", "closing-brackets-in-a-string", "a-deep-member", "after-an-escape"])
def test_a_body_nested_past_the_limit_is_json_too_deep(body: bytes) -> None:
    with pytest.raises(DomainError) as refused:
        decode_json(body)
    assert refused.value.code == "json_too_deep"


def test_pairing_refuses_a_body_past_the_public_limit_before_reading_it(
        http: TestClient[Any]) -> None:
    body = b'{"code": "pc_x-y", "name": "n", ' + b'"k": 0, ' * (PUBLIC_BODY_BYTES // 8) + b'"z": 0}'
    answer = http.post("/v1/pair", content=body, headers={"Content-Type": "application/json"})
    assert (answer.status_code, answer.json()["code"]) == (413, "body_too_large")


def test_pairing_still_reads_a_body_within_the_public_limit(http: TestClient[Any]) -> None:
    answer = http.post("/v1/pair", json={"code": "pc_x-y", "name": "n" * 200})
    assert (answer.status_code, answer.json()["code"]) == (401, "invalid_pairing_code")


def test_the_console_login_refuses_a_form_past_the_public_limit(
        http: TestClient[Any]) -> None:
    fields = {f"f{n}": "" for n in range(PUBLIC_BODY_BYTES // 4)}
    answer = http.post("/console/login", data={**fields, "token": "tw_x"},
                       follow_redirects=False)
    assert answer.status_code == 413


def test_the_console_login_still_reads_a_form_within_the_public_limit(
        http: TestClient[Any]) -> None:
    answer = http.post("/console/login", data={"token": "tw_" + "x" * 500},
                       follow_redirects=False)
    assert answer.status_code == 401
