"""Sampling defaults that a model entry carries in its `metadata` (docs/operations.md).

A request that leaves a sampling field unset gets the entry's value, so a model is
registered once with the values its authors recommend and every client benefits; a
field the request sets always wins. The values are strings (entry metadata is string
pairs) and are checked when the entry is registered, so a task never meets a bad one.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

from core.engines.base import GenerationRequest

# metadata key -> (lowest, highest, whether the lowest itself is allowed)
_BOUNDS: dict[str, tuple[float, float, bool]] = {
    "temperature": (0.0, 2.0, True),  # near 0 is greedy (`llama_sampling.GREEDY_BELOW`)
    "top_p": (0.0, 1.0, False),
    "top_k": (0.0, 1000.0, True),
    # A penalty divides a repeated token's positive logit by it: 10 mutes repetition,
    # and its mirror 1/10 makes it ten times likelier already; far below, the division
    # overflows llama.cpp's float32 (1e-45 reads as 0) and no text is generated at all.
    "repeat_penalty": (0.1, 10.0, True),
}
SAMPLING_KEYS = tuple(_BOUNDS)
# A plain ASCII decimal: `float()` would also take "0_1" (as 1.0, not the 0.1 meant),
# other scripts' digits, "inf" and surrounding blanks.
_PLAIN_DECIMAL = re.compile(r"[+-]?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?")


def sampling_metadata_error(metadata: Mapping[str, str]) -> str | None:
    """Why the sampling keys of an entry's metadata are unusable, or None."""
    for key, (low, high, low_ok) in _BOUNDS.items():
        if key not in metadata:
            continue
        if _PLAIN_DECIMAL.fullmatch(metadata[key]) is None:
            return f"metadata.{key} must be a decimal number such as 0.5 or 1e-2"
        value = float(metadata[key])
        in_range = (value >= low if low_ok else value > low) and value <= high
        if not math.isfinite(value) or not in_range:
            return f"metadata.{key} must be in {'[' if low_ok else '('}{low:g}, {high:g}]"
        if key == "top_k" and not value.is_integer():
            return "metadata.top_k must be a whole number"
    return None


def with_model_defaults(
    request: GenerationRequest, metadata: Mapping[str, str]
) -> GenerationRequest:
    """`request` with every unset sampling field taken from the entry's metadata."""
    if sampling_metadata_error(metadata) is not None:
        return request  # registered before the check existed: the request stands as sent
    changes: dict[str, Any] = {}
    for key in SAMPLING_KEYS:
        if getattr(request, key) is None and key in metadata:
            value = float(metadata[key])
            changes[key] = int(value) if key == "top_k" else value
    return dataclasses.replace(request, **changes) if changes else request
