"""The default engine: GGUF models run on CPU by llama.cpp, through the `cyllama` wheel.

A loaded model is shared by every attempt of this process that uses it: its
`generate` turns a request into a sequence of the model's decode loop
(`core.engines.llama_loop`), which batches all running sequences into one
`llama_decode` per token, and yields that sequence's chunks as the loop makes them.
Sampling is rebuilt per token from (seed, position) (`core.engines.llama_sampling`)
and resume replays the snapshot's tokens as the first run fed them, so a sequence that
runs alone is exact across resumes and processes.
"""

from __future__ import annotations

import functools
import logging
import secrets
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator

from core.engines.base import (
    Chunk,
    Emit,
    EngineError,
    EngineOptions,
    GenerationRequest,
    ModelFile,
    Snapshot,
    storable,
)
from core.engines.llama_loop import (
    END,
    MAX_SEQUENCES,
    SNAPSHOT_VERSION,
    DecodeLoop,
    LoopShape,
    Sequence,
)
from core.engines.llama_native import llama_cpp
from core.engines.llama_sampling import Sampling, is_greedy
from core.engines.llama_text import Utf8Pieces
from core.errors import InvalidInput
from core.model_files import hashed_file

log = logging.getLogger(__name__)

DEFAULT_MAX_OUTPUT_TOKENS = 256
_BPE = 2  # llama.h's LLAMA_VOCAB_TYPE_BPE, which the binding does not export


@functools.cache
def init_backend() -> None:
    """Silence llama.cpp's stderr logging and load its CPU backend, once per process."""
    llama_cpp.disable_logging()
    llama_cpp.ggml_backend_load_all()


class LlamaEngine:
    """Loads GGUF files into a bounded per-process LRU keyed by their sha256.

    One file's weights are never loaded twice: a model pushed out of the cache while
    attempts still hold it stays loaded for them, its decode loop serving them on, and
    a lookup finds it there before reading the file again (two copies would each run a
    loop with the engine's threads and KV cells). So the cache bounds the models kept
    for later, and the models loaded at once are at most those plus the ones in use.
    """

    name = "llama.cpp"

    def __init__(self, options: EngineOptions) -> None:
        self._options = options
        self._cached: OrderedDict[str, LlamaLoadedModel] = OrderedDict()
        # Every model still held by anyone: the cache, or an attempt that loaded it.
        self._loaded: weakref.WeakValueDictionary[str, LlamaLoadedModel] = (
            weakref.WeakValueDictionary())
        self._lock = threading.Lock()

    def load(self, model: ModelFile) -> LlamaLoadedModel:
        with self._lock:
            loaded = self._loaded.get(model.sha256)
            if loaded is None:
                loaded = LlamaLoadedModel(_read_model(model), self._options)
                self._loaded[model.sha256] = loaded
            self._cached[model.sha256] = loaded
            self._cached.move_to_end(model.sha256)
            self._evict()
            return loaded

    def _evict(self) -> None:
        """Trim the cache to its size, never dropping the model just asked for: the least
        recently used model whose loop is idle goes first, since it frees its memory now
        (one in use frees it when its last attempt ends)."""
        while len(self._cached) > self._options.cache_size:
            older = list(self._cached)[:-1]
            idle = [digest for digest in older if not self._cached[digest].loop.running]
            del self._cached[(idle or older)[0]]


def _read_model(model: ModelFile) -> llama_cpp.LlamaModel:
    """The model's weights, read into this process's own memory from bytes that hash to
    `model.sha256` (`hashed_file`): the loaded model is cached under that digest.

    Not mapped (llama.cpp maps by default): a mapped file that is truncated or
    overwritten in place while a model of it runs makes the next read of a dropped page
    SIGBUS, which kills the process and every task in it. Copied, the weights are the
    ones verified until the model is evicted, and the next task's digest check fails on
    the changed file. The cost, measured on the default model: a load 0.25 s instead of
    0.21 s, and its 95 MB private (anonymous) memory rather than shared page cache.
    """
    init_backend()
    params = llama_cpp.LlamaModelParams()
    params.n_gpu_layers = 0
    params.use_mmap = False
    try:
        with hashed_file(model.path) as (pinned_path, digest):
            if digest.sha256 != model.sha256:
                raise EngineError("model_digest_mismatch", "the model file was replaced "
                                  "since its digest was checked", retryable=False)
            llama_model = _loaded(model, str(pinned_path), params)
    except InvalidInput as exc:  # vanished, or changed while it was hashed or loaded
        raise EngineError(exc.code, exc.message, retryable=False) from None
    try:
        apply_template(llama_model, [{"role": "user", "content": "probe"}])
    except RuntimeError as exc:
        raise EngineError(
            "model_load_failed",
            f"model {model.model_id!r} has no chat template llama.cpp supports",
            retryable=False,
        ) from exc
    return llama_model


def _loaded(
    model: ModelFile, pinned_path: str, params: llama_cpp.LlamaModelParams
) -> llama_cpp.LlamaModel:
    """llama.cpp's model of the file at `pinned_path`. A failure tells the client which
    model and a fixed reason; the binding's own message goes to the log, with the
    model's path (which the operator knows) in place of the descriptor's."""
    try:
        return llama_cpp.LlamaModel(pinned_path, params)
    except Exception as exc:
        # The binding's words name the path and its own debugging knobs: the operator's.
        log.warning("cannot load model %r from %s: %s", model.model_id, model.path,
                    str(exc).replace(pinned_path, str(model.path)))
        raise EngineError(
            "model_load_failed", f"cannot load model {model.model_id!r}: the model file "
            "could not be loaded (not a valid GGUF file, or not enough memory)",
            retryable=False,
        ) from exc


def apply_template(llama_model: llama_cpp.LlamaModel, messages: list[dict[str, str]]) -> str:
    """The model's chat template as llama.cpp's built-in renderer applies it.

    llama.cpp takes each message as a C string, which would end it at its first NUL
    and silently drop the rest: every NUL (and lone surrogate, which has no UTF-8 form)
    becomes U+FFFD first, as in the upstream engine's output, so the whole text is read.
    """
    chat = [llama_cpp.LlamaChatMessage(role=m["role"], content=storable(m["content"]))
            for m in messages]
    template = llama_model.get_default_chat_template() or None
    return llama_model.chat_apply_template(template, chat, True)


def content_cut(
    llama_model: llama_cpp.LlamaModel, messages: list[dict[str, str]], rendered: str
) -> list[str] | None:
    """`rendered`, the template's rendering of `messages`, cut where each message's
    content stands: markup, content, markup, …, markup. None when the template does not
    insert every content unchanged and in order (a template may trim one), since then no
    cut tells a content's text from the template's.

    The messages are rendered again with each content replaced by a marker absent from
    `rendered`, and the markup between markers is trusted only if putting the contents
    back gives `rendered` exactly.
    """
    marker = _marker_absent_from(rendered)
    marked = apply_template(llama_model, [{**m, "content": marker} for m in messages])
    markup = marked.split(marker)
    if len(markup) != len(messages) + 1:
        return None
    pieces = [markup[0]]
    for message, after in zip(messages, markup[1:], strict=True):
        pieces += [storable(message["content"]), after]
    return pieces if "".join(pieces) == rendered else None


def _marker_absent_from(text: str) -> str:
    """A random string that `text` does not hold, to stand in for a message's content."""
    while (marker := f"content-{secrets.token_hex(16)}") in text:
        pass
    return marker


class LlamaLoadedModel:
    """One loaded GGUF model and its decode loop; `generate` may be called from several
    threads at once, and the calls share the loop's batches."""

    def __init__(self, llama_model: llama_cpp.LlamaModel, options: EngineOptions) -> None:
        self.llama_model = llama_model
        self._vocab = llama_model.get_vocab()
        self.context_tokens = min(llama_model.n_ctx_train, options.context_tokens)
        shape = LoopShape(threads=options.threads,
                          sequences=max(1, min(options.sequences, MAX_SEQUENCES)),
                          cells=self.context_tokens)
        self.loop = DecodeLoop(llama_model, shape, options.host_lock)
        # Unloaded (out of the cache, and no attempt holds it): no sequence can come any
        # more, so the loop's idle thread ends now and frees the context and weights.
        weakref.finalize(self, self.loop.close)

    def generate(
        self,
        request: GenerationRequest,
        snapshot: Snapshot | None,
        should_stop: Callable[[], bool],
        emit: Emit | None = None,
    ) -> Iterator[Chunk]:
        """Yield UTF-8-complete pieces, each with the snapshot and usage right after it.

        The snapshot is `{"v", "tokens", "seed"}`: the generated token ids and the seed
        actually used (drawn at random, and kept, when the request samples and names
        none). Text is never empty except, possibly, on a final chunk that accounts for
        tokens which render as nothing. `should_stop` is polled by the loop before every
        step, so a stop takes effect within one step, and is told while the sequence
        waits for KV cells if it keeps such waits apart (`ExcludesWaits`).
        """
        prompt = self.prompt_tokens(request.messages)
        tokens, seed = self._resume_point(snapshot, request)
        limit = request.max_output_tokens
        if limit is None:
            limit = DEFAULT_MAX_OUTPUT_TOKENS
        budget = min(limit, self.context_tokens - len(prompt))
        if len(tokens) >= budget:
            return
        sequence = Sequence(prompt=prompt, tokens=tokens, budget=budget,
                            sampling=Sampling.of(request, seed), pieces=Utf8Pieces(self._vocab),
                            should_stop=should_stop)
        self.loop.submit(sequence)
        try:
            while (item := sequence.out.get()) is not END:
                if isinstance(item, BaseException):
                    raise item
                assert isinstance(item, Chunk)
                yield item
        finally:
            sequence.abandoned.set()  # a consumer that stops reading frees its slot

    def prompt_tokens(self, messages: list[dict[str, str]]) -> list[int]:
        """The messages as the model's chat template renders them, in token ids."""
        try:
            prompt = apply_template(self.llama_model, messages)
            cut = content_cut(self.llama_model, messages, prompt)
        except (RuntimeError, KeyError, TypeError) as exc:
            raise EngineError(
                "invalid_messages",
                "the chat template cannot render these messages",
                retryable=False,
            ) from exc
        if cut is not None and self._vocab.vocab_type == _BPE:
            tokens = self._cut_tokens(cut)
        else:
            tokens = self._whole_tokens(prompt, messages)
        if len(tokens) >= self.context_tokens:
            raise EngineError(
                "context_length_exceeded",
                f"prompt is {len(tokens)} tokens; the context holds {self.context_tokens}",
                retryable=False,
            )
        return tokens

    def _cut_tokens(self, cut: list[str]) -> list[int]:
        """The prompt in token ids, control tokens read in the template's markup only.

        A client's message that spells the template's markers (`<|im_end|>`) must stay
        text: read as control tokens, it ends its own turn and forges others (a system
        prompt, an assistant's answer). Each piece is tokenized alone. With BPE that
        gives the whole prompt's tokens except where whitespace at a content's start
        would have merged with the markup's before it (a newline opening a content after
        the markup's newline is a token of its own): the same text, a token longer.
        Vocabularies that prefix every text fragment with a space (SentencePiece) would
        change the text, so they are read whole instead.
        """
        vocab = self._vocab
        tokens = [vocab.token_bos()] if vocab.get_add_bos() else []
        for index, piece in enumerate(cut):
            tokens += vocab.tokenize(piece, False, index % 2 == 0)
        if vocab.get_add_eos():
            tokens.append(vocab.token_eos())
        return tokens

    def _whole_tokens(self, prompt: str, messages: list[dict[str, str]]) -> list[int]:
        """The prompt in token ids, read whole, for a template or vocabulary that cannot
        be tokenized piece by piece: safe only if no content spells a control token, so
        a message that does is refused rather than let it forge turns."""
        vocab = self._vocab
        for message in messages:
            content = storable(message["content"])
            if vocab.tokenize(content, False, True) != vocab.tokenize(content, False, False):
                raise EngineError(
                    "invalid_messages",
                    "a message spells a control token of this model's chat template",
                    retryable=False,
                )
        return vocab.tokenize(prompt, True, True)

    def _resume_point(
        self, snapshot: Snapshot | None, request: GenerationRequest
    ) -> tuple[list[int], int | None]:
        """Tokens generated so far and the seed to keep using."""
        if snapshot is None:
            if request.seed is None and not is_greedy(request.temperature):
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

