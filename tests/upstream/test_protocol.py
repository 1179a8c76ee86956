"""The Chat Completions details: echoed prefixes, what a chunk carries (and what a broken
upstream's chunk is read as), error mapping, Retry-After."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from email.utils import format_datetime

import pytest

from core.engines.upstream.hosts import UrlRefused, check_allowed
from core.engines.upstream.protocol import (
    MAX_TOKENS,
    EchoStrip,
    Piece,
    parse_chunk,
    parse_retry_after,
    payload,
    status_error,
)


def stream(strip: EchoStrip, *deltas: str) -> str:
    return "".join(strip.push(d) for d in deltas) + strip.flush()


def test_an_echoed_prefix_is_stripped_even_across_deltas() -> None:
    # llama-server's first delta repeats the prefill: "One, two, three, four, five".
    assert stream(EchoStrip("One, two, three, four,"), "One, two, three, four, five", ",") == (
        " five,")
    assert stream(EchoStrip("One, two,"), "One,", " two, three") == " three"


def test_a_continuation_without_echo_is_kept_whole() -> None:
    assert stream(EchoStrip("One, two,"), " three", ", four") == " three, four"
    assert stream(EchoStrip("One, two,"), "One") == "One"  # ended while it still could be


@pytest.mark.parametrize("chunk", [{"choices": {"0": {}}}, {"choices": "text"},
                                   {"choices": None}, {"choices": ["text"]}, {}])
def test_a_chunk_without_a_list_of_choices_carries_no_text(chunk: dict[str, object]) -> None:
    # A server's odd shape is no text, not a crash of the attempt (a dict of choices
    # raised KeyError).
    assert parse_chunk(chunk, "http://u") == Piece("")


@pytest.mark.parametrize(("reported", "counted"), [
    (7, 7), (MAX_TOKENS, MAX_TOKENS), (MAX_TOKENS + 1, None), (10**11, None), (-1, None),
    (True, None), (2.0, None), ("7", None)])
def test_a_token_count_no_store_column_holds_is_not_reported(
    reported: object, counted: int | None
) -> None:
    chunk = {"choices": [], "usage": {"prompt_tokens": reported, "completion_tokens": reported}}
    assert parse_chunk(chunk, "http://u") == Piece("", False, counted, counted)


def test_a_lone_surrogate_in_a_delta_becomes_the_replacement_character() -> None:
    # JSON may escape a lone surrogate and Python's parser keeps it; no UTF-8 text can.
    lone = json.loads('{"choices": [{"delta": {"content": "ok \\ud800 end\\udc00"}}]}')
    assert parse_chunk(lone, "http://u").text == "ok \ufffd end\ufffd"
    pair = json.loads('{"choices": [{"delta": {"content": "\\ud83d\\ude00 \u00e9"}}]}')
    assert parse_chunk(pair, "http://u").text == "\U0001f600 \u00e9"  # a pair is kept


def test_a_nul_in_a_delta_becomes_the_replacement_character() -> None:
    # PostgreSQL's text holds no NUL: the attempt's write was refused on every retry.
    nul = json.loads('{"choices": [{"delta": {"content": "nul\\u0000byte \u00e9\\u0000"}}]}')
    assert parse_chunk(nul, "http://u").text == "nul\ufffdbyte \u00e9\ufffd"


def test_bytes_that_are_not_utf8_become_the_replacement_character() -> None:
    data = b'{"choices": [{"delta": {"content": "bad \xff\xfe bytes \xe2\x82"}}]}'
    assert parse_chunk(payload(data), "http://u").text == "bad \ufffd\ufffd bytes \ufffd"


def test_a_well_formed_payload_is_read_as_json_and_a_malformed_one_still_refused() -> None:
    data = b'{"choices": [{"index": 0, "delta": {"content": "\xc3\xa9 \\ud83d\\ude00"}}]}'
    assert payload(data) == json.loads(data)
    with pytest.raises(ValueError):
        payload(b'{"choices": [\xff')


def test_a_usage_integer_too_long_to_convert_is_not_reported() -> None:
    # Python refuses to convert an integer of over 4,300 digits: it broke the stream.
    data = b'{"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": %s}}'
    for digits in (b"9" * 5000, b"-" + b"9" * 5000):
        assert parse_chunk(payload(data % digits), "http://u") == Piece("", False, 5, None)


@pytest.mark.parametrize(("reason", "finished"), [
    ("stop", True), ("length", True), (None, False), ("", False), (False, False), (0, False)])
def test_only_a_non_empty_finish_reason_finishes(reason: object, finished: bool) -> None:
    # Some servers send "" in every chunk that goes on: it cut their text after one delta.
    chunk = {"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": reason}]}
    assert parse_chunk(chunk, "http://u") == Piece("a", finished)


def test_only_the_choice_numbered_zero_is_read() -> None:
    def choice(index: int, text: str, reason: str | None = None) -> dict[str, object]:
        return {"index": index, "delta": {"content": text}, "finish_reason": reason}

    both = {"choices": [choice(1, "other", "stop"), choice(0, "ours")]}
    assert parse_chunk(both, "http://u") == Piece("ours")
    assert parse_chunk({"choices": [choice(1, "other", "stop")]}, "http://u") == Piece("")
    unnumbered = {"choices": [{"delta": {"content": "first"}}, {"delta": {"content": "x"}}]}
    assert parse_chunk(unnumbered, "http://u") == Piece("first")


@pytest.mark.parametrize(("status", "code", "retryable"), [
    (429, "upstream_rate_limited", True), (503, "upstream_unavailable", True),
    (408, "upstream_unavailable", True), (400, "upstream_rejected", False),
    (404, "upstream_rejected", False), (302, "upstream_rejected", False),
])
def test_statuses_map_to_stable_codes(status: int, code: str, retryable: bool) -> None:
    error = status_error("http://gpu-1:8000/v1", status, None)
    assert (error.code, error.retryable) == (code, retryable)
    assert error.message.startswith(f"upstream http://gpu-1:8000/v1 answered {status}")


def test_retry_after_is_seconds_or_a_date_and_bounded() -> None:
    assert parse_retry_after("7") == 7.0
    now = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
    later = format_datetime(datetime(2026, 12, 1, 8, 0, 30, tzinfo=UTC), usegmt=True)
    assert parse_retry_after(later, now=now.timestamp()) == 30.0
    assert parse_retry_after("999999") == 3600.0
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None
    assert status_error("http://x/v1", 429, "12").retry_after_seconds == 12.0


@pytest.mark.parametrize("value", ["\u00b2", "\u00b9\u00b2", "7\u00b2", "\u0663", "1.5", "-3"])
def test_a_retry_after_of_anything_but_ascii_digits_or_a_date_is_ignored(value: str) -> None:
    # "²" (a latin-1 header byte) passed `str.isdigit` and made `float` raise on every
    # attempt: the task failed as engine_error instead of being backed off.
    assert parse_retry_after(value) is None
    error = status_error("http://x/v1", 429, value)
    assert (error.code, error.retry_after_seconds) == ("upstream_rate_limited", None)


def test_host_patterns_allow_only_matching_hosts() -> None:
    check_allowed("http://gpu-1.internal:8000/v1", ("*.internal",))
    check_allowed("http://anything/v1", ())
    with pytest.raises(UrlRefused) as refused:
        check_allowed("http://169.254.169.254/v1", ("*.internal", "10.0.0.5"))
    assert refused.value.code == "upstream_host_not_allowed"
