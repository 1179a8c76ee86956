"""Per-token sampler chains for the llama.cpp engine, rebuilt from (seed, position).

Every sampled token gets its own RNG seed derived from (seed, output position), so the
draw at position k depends neither on how many draws this process made nor on which
other sequences share the batch: a resumed sequence draws exactly what an
uninterrupted one would have drawn from the same logits. The repetition penalty looks
at the last tokens of the sequence itself, which a resume rebuilds from its snapshot.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from core.engines.base import GenerationRequest
from core.engines.llama_native import llama_cpp

_RANDOM_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: llama.cpp reads it as "pick any seed"
PENALTY_LAST_N = 64  # llama.cpp's default window for the repetition penalty
# Temperatures below this are greedy. Sampling at temperature T draws from
# softmax(logits / T), which converges to the arg max as T goes to 0, so greedy is what
# a tiny T means; computed instead, llama.cpp's float32 `logit / T` overflows to inf
# below about 1e-37 and the draw is of NaNs: random tokens. At 1e-6 the most likely
# token already outweighs one a thousandth of a logit behind it by e^1000.
GREEDY_BELOW = 1e-6


def is_greedy(temperature: float | None) -> bool:
    """Whether a request's (or entry's) temperature means greedy decoding."""
    return temperature is None or temperature < GREEDY_BELOW


@dataclass(frozen=True)
class Sampling:
    """Greedy when temperature is unset or below `GREEDY_BELOW`; otherwise penalties,
    top-k, top-p, temperature, then a seeded draw (llama.cpp's own order)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repeat_penalty: float | None = None
    seed: int | None = None

    @classmethod
    def of(cls, request: GenerationRequest, seed: int | None) -> Sampling:
        return cls(request.temperature, request.top_p, request.top_k, request.repeat_penalty,
                   seed)

    @property
    def greedy(self) -> bool:
        return is_greedy(self.temperature)

    def sampler_at(self, position: int, history: list[int]) -> llama_cpp.LlamaSampler:
        """The chain for output `position`; `history` is the sequence so far."""
        params = llama_cpp.LlamaSamplerChainParams()
        params.no_perf = True
        chain = llama_cpp.LlamaSampler(params)
        if self.repeat_penalty is not None and self.repeat_penalty != 1.0:
            chain.add_penalties(PENALTY_LAST_N, self.repeat_penalty, 0.0, 0.0)
            for token in history[-PENALTY_LAST_N:]:
                chain.accept(token)
        if self.greedy:
            chain.add_greedy()
            return chain
        if self.top_k:
            chain.add_top_k(self.top_k)
        if self.top_p is not None and self.top_p < 1.0:
            chain.add_top_p(self.top_p, 1)
        chain.add_temp(self.temperature)
        chain.add_dist(position_seed(self.seed, position))
        return chain


def position_seed(seed: int | None, position: int) -> int:
    """A 32-bit seed for one output position, never llama.cpp's "random" value."""
    digest = hashlib.blake2b(f"{seed}:{position}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") % _RANDOM_SEED
