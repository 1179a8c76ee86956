"""The default engine: GGUF models run on CPU by llama.cpp, through the `cyllama` wheel.

Exact resume rests on two choices, both measured against this llama.cpp build:

- Every sampled token gets its own RNG seed derived from (seed, output position), so
  the draw at position k does not depend on how many draws happened in this process.
- A resumed run rebuilds the KV cache by decoding the prompt in one batch and then the
  generated tokens one at a time, exactly as the first run did. Decoding those tokens
  in one batch is about 3x faster but yields a KV cache that differs in its low bits,
  and a float off by one ulp can flip a later token. Restoring a saved sequence state
  would be exact too, but it weighs about 21 kB per token, too much for a snapshot that
  is written after every flush.

Each `generate` call creates its own llama context (a few milliseconds), so loaded
models are shared read-only and several generations may run at once.
"""

from __future__ import annotations

import functools
import hashlib
import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from cyllama.llama import llama_cpp

from core.engines.base import (
    Chunk,
    EngineError,
    EngineOptions,
    GenerationRequest,
    ModelFile,
    Snapshot,
    Usage,
)

DEFAULT_MAX_OUTPUT_TOKENS = 256
SNAPSHOT_VERSION = 1
_BATCH = 512  # tokens per llama_decode call; fixed, because batching shapes the numbers
_MAX_HELD_TOKENS = 8  # a UTF-8 character that has not completed by then never will
_REPLACEMENT = "\ufffd"
_RANDOM_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: llama.cpp reads it as "pick any seed"


@functools.cache
def _init_backend() -> None:
    """Silence llama.cpp's stderr logging and load its CPU backend, once per process."""
    llama_cpp.disable_logging()
    llama_cpp.ggml_backend_load_all()


class LlamaEngine:
    """Loads GGUF files into a bounded per-process LRU keyed by their sha256."""

    name = "llama.cpp"

    def __init__(self, options: EngineOptions) -> None:
        self._options = options
        self._models: OrderedDict[str, LlamaLoadedModel] = OrderedDict()
        self._lock = threading.Lock()

    def load(self, model: ModelFile) -> LlamaLoadedModel:
        # Eviction only drops the cache's reference: a running generation keeps its own.
        with self._lock:
            loaded = self._models.get(model.sha256)
            if loaded is None:
                loaded = LlamaLoadedModel(_read_model(model), threads=self._options.threads)
                self._models[model.sha256] = loaded
                while len(self._models) > self._options.cache_size:
                    self._models.popitem(last=False)
            self._models.move_to_end(model.sha256)
            return loaded


def _read_model(model: ModelFile) -> llama_cpp.LlamaModel:
    _init_backend()
    params = llama_cpp.LlamaModelParams()
    params.n_gpu_layers = 0
    try:
        llama_model = llama_cpp.LlamaModel(str(model.path), params)
    except Exception as exc:
        raise EngineError(
            "model_load_failed", f"cannot load model {model.model_id!r}: {exc}", retryable=False
        ) from exc
    try:
        _apply_template(llama_model, [{"role": "user", "content": "probe"}])
    except RuntimeError as exc:
        raise EngineError(
            "model_load_failed",
            f"model {model.model_id!r} has no chat template llama.cpp supports",
            retryable=False,
        ) from exc
    return llama_model


def _apply_template(llama_model: llama_cpp.LlamaModel, messages: list[dict[str, str]]) -> str:
    """The model's chat template as llama.cpp's built-in renderer applies it."""
    chat = [llama_cpp.LlamaChatMessage(role=m["role"], content=m["content"]) for m in messages]
    template = llama_model.get_default_chat_template() or None
    return llama_model.chat_apply_template(template, chat, True)


@dataclass(frozen=True)
class _Sampling:
    """Greedy when temperature is 0 or unset; otherwise temperature, top-p, then a draw."""

    temperature: float | None
    top_p: float | None
    seed: int | None

    @property
    def greedy(self) -> bool:
        return not self.temperature

    def sampler_at(self, position: int) -> llama_cpp.LlamaSampler:
        params = llama_cpp.LlamaSamplerChainParams()
        params.no_perf = True
        chain = llama_cpp.LlamaSampler(params)
        if self.greedy:
            chain.add_greedy()
            return chain
        chain.add_temp(self.temperature)
        if self.top_p is not None and self.top_p < 1.0:
            chain.add_top_p(self.top_p, 1)
        chain.add_dist(_position_seed(self.seed, position))
        return chain


def _position_seed(seed: int | None, position: int) -> int:
    """A 32-bit seed for one output position, never llama.cpp's "random" value."""
    digest = hashlib.blake2b(f"{seed}:{position}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") % _RANDOM_SEED


class LlamaLoadedModel:
    """One loaded GGUF model; `generate` may be called from several threads at once."""

    def __init__(self, llama_model: llama_cpp.LlamaModel, *, threads: int) -> None:
        self._model = llama_model
        self._vocab = llama_model.get_vocab()
        self._threads = threads

    def generate(
        self,
        request: GenerationRequest,
        snapshot: Snapshot | None,
        should_stop: Callable[[], bool],
    ) -> Iterator[Chunk]:
        """Yield UTF-8-complete pieces, each with the snapshot and usage right after it.

        The snapshot is `{"v", "tokens", "seed"}`: the generated token ids and the seed
        actually used (drawn at random, and kept, when the request has none). Text is
        never empty except, possibly, on a final chunk that accounts for tokens which
        render as nothing.
        """
        prompt = self._prompt_tokens(request.messages)
        tokens, seed = self._resume_point(snapshot, request)
        limit = request.max_output_tokens
        if limit is None:
            limit = DEFAULT_MAX_OUTPUT_TOKENS
        n_ctx = min(self._model.n_ctx_train, len(prompt) + limit)
        budget = min(limit, n_ctx - len(prompt))
        if len(tokens) >= budget:
            return
        sampling = _Sampling(request.temperature, request.top_p, seed)
        pieces = _Utf8Pieces(self._vocab)
        emitted = len(tokens)

        def chunk(text: str) -> Chunk:
            state = {"v": SNAPSHOT_VERSION, "tokens": list(tokens), "seed": seed}
            return Chunk(text, state, Usage(len(prompt), len(tokens)))

        with self._context(n_ctx) as ctx:
            if should_stop():
                return
            _decode(ctx, prompt, 0)
            for offset, token in enumerate(tokens):
                if should_stop():
                    return
                _decode(ctx, [token], len(prompt) + offset)
            while len(tokens) < budget:
                if should_stop():
                    return
                token = _sample(ctx, sampling.sampler_at(len(tokens)))
                if self._vocab.is_eog(token):
                    break
                tokens.append(token)
                if len(tokens) < budget:
                    _decode(ctx, [token], len(prompt) + len(tokens) - 1)
                if text := pieces.push(token):
                    emitted = len(tokens)
                    yield chunk(text)
            if len(tokens) > emitted:
                yield chunk(pieces.flush())

    def _prompt_tokens(self, messages: list[dict[str, str]]) -> list[int]:
        try:
            prompt = _apply_template(self._model, messages)
        except (RuntimeError, KeyError, TypeError) as exc:
            raise EngineError(
                "invalid_messages",
                "the chat template cannot render these messages",
                retryable=False,
            ) from exc
        tokens = self._vocab.tokenize(prompt, True, True)
        n_ctx_train = self._model.n_ctx_train
        if len(tokens) >= n_ctx_train:
            raise EngineError(
                "context_length_exceeded",
                f"prompt is {len(tokens)} tokens; the model's context holds {n_ctx_train}",
                retryable=False,
            )
        return tokens

    def _resume_point(
        self, snapshot: Snapshot | None, request: GenerationRequest
    ) -> tuple[list[int], int | None]:
        """Tokens generated so far and the seed to keep using."""
        if snapshot is None:
            if request.seed is None and request.temperature:
                return [], secrets.randbits(32)
            return [], request.seed
        tokens, seed = snapshot.get("tokens"), snapshot.get("seed")
        n_vocab = self._vocab.n_vocab
        if (
            snapshot.get("v") != SNAPSHOT_VERSION
            or not isinstance(tokens, list)
            or not all(isinstance(t, int) and 0 <= t < n_vocab for t in tokens)
            or not (seed is None or isinstance(seed, int))
        ):
            raise EngineError(
                "invalid_snapshot",
                "snapshot was not written by this engine version",
                retryable=False,
            )
        return list(tokens), seed

    @contextmanager
    def _context(self, n_ctx: int) -> Iterator[llama_cpp.LlamaContext]:
        params = llama_cpp.LlamaContextParams()
        params.n_ctx = n_ctx
        params.n_batch = _BATCH
        params.n_ubatch = _BATCH
        params.n_threads = self._threads
        params.n_threads_batch = self._threads
        params.no_perf = True
        try:
            ctx = llama_cpp.LlamaContext(self._model, params)
        except Exception as exc:
            raise EngineError(
                "engine_error",
                f"cannot create a llama context ({type(exc).__name__})",
                retryable=True,
            ) from exc
        try:
            yield ctx
        finally:
            ctx.close()


def _decode(ctx: llama_cpp.LlamaContext, tokens: list[int], position: int) -> None:
    try:
        for start in range(0, len(tokens), _BATCH):
            batch = llama_cpp.llama_batch_get_one(tokens[start : start + _BATCH], position + start)
            ctx.decode(batch)
    except Exception as exc:
        raise EngineError("engine_error", f"llama_decode failed ({exc})", retryable=True) from exc


def _sample(ctx: llama_cpp.LlamaContext, sampler: llama_cpp.LlamaSampler) -> int:
    try:
        return sampler.sample(ctx, -1)
    except Exception as exc:
        raise EngineError("engine_error", f"sampling failed ({exc})", retryable=True) from exc


class _Utf8Pieces:
    """Token ids in, text out, never ending inside a multibyte character.

    The binding decodes pieces with replacement characters, so a character whose bytes
    span tokens shows up as U+FFFD. Such tokens are held back and decoded together with
    the following ones until the character completes. The binding's `detokenize` also
    strips leading whitespace, so held runs are decoded behind a visible anchor token
    whose text is then cut off.
    """

    def __init__(self, vocab: llama_cpp.LlamaVocab) -> None:
        self._vocab = vocab
        self._anchor = vocab.tokenize("a", False, False)[-1]
        self._anchor_text = self._detokenize([self._anchor])
        self._held: list[int] = []

    def push(self, token: int) -> str:
        self._held.append(token)
        text = self._decode()
        if _REPLACEMENT in text and len(self._held) < _MAX_HELD_TOKENS:
            return ""
        self._held.clear()
        return text

    def flush(self) -> str:
        text = self._decode() if self._held else ""
        self._held.clear()
        return text

    def _decode(self) -> str:
        if len(self._held) == 1:
            return self._vocab.token_to_piece(self._held[0], 0, False)
        return self._detokenize([self._anchor, *self._held])[len(self._anchor_text) :]

    def _detokenize(self, tokens: list[int]) -> str:
        return self._vocab.detokenize(tokens, 4096, False, False)

