"""One decode loop per loaded model: every running generation of that model shares one
llama.cpp context, and each step decodes one token of every sequence in one batch.

Why: on a CPU, a decode step costs about the same for one token as for several (the
weights are read once per step), so eight sequences in one batch run at about twice
the aggregate rate of eight generations each decoding alone (docs/benchmarks.md).

How a step goes, on the loop's own thread:
1. sequences that asked to join are admitted while a sequence id and KV cells for
   their whole budget are free (FIFO); sequences whose `should_stop()` is true leave,
   waiting or not, so a cancel takes effect within one step. A sequence's wait for
   admission is told to its `should_stop` when that keeps such waits apart
   (`core.engines.base.ExcludesWaits`): the attempt's execution timeout skips it;
2. the batch gets one token per generating sequence, and at most `_PREFILL_TOKENS`
   prompt tokens of joining sequences, so a long prompt is spread over several steps
   instead of stalling the others;
3. one `llama_decode` in the process's compute turn, and under the host lock
   (`core.engines.host_lock`) when there is one;
4. every sequence whose last token was in the batch samples its next one.

Threads. Each loop's context computes with the engine's threads (the usable cores by
default), so two models decoding at once would run twice that on the same cores, each
step's threads waiting at their barriers for the other's. The loops of a process take
turns instead, a step each, as the host lock makes processes do: no more threads
compute at once than `TASKWARD_ENGINE_THREADS` names, however many models are in use.

Exactness. A resume replays the prompt in the same chunks and then the generated
tokens one per step, exactly as the first run fed them: decoding those tokens in one
batch would be faster but yields a KV cache that differs in its low bits, and a float
off by one ulp can flip a later token. So a sequence that runs alone gives the same
text whenever it runs, resumed or not. Sharing a batch changes the shapes llama.cpp
computes with, so the same request may give other text beside other sequences; the
snapshot holds the tokens actually emitted, so a resume never repeats or drops text.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from core.engines.base import Chunk, EngineError, ExcludesWaits, Usage
from core.engines.host_lock import HostLock
from core.engines.llama_native import llama_cpp
from core.engines.llama_sampling import PENALTY_LAST_N, Sampling
from core.engines.llama_text import Utf8Pieces
from core.thread_names import named_thread

log = logging.getLogger(__name__)

SNAPSHOT_VERSION = 1
STEP_TOKENS = 512  # llama_decode's batch; also fixed because batch shapes shape numbers
_PREFILL_TOKENS = 64  # prompt tokens per step: a joining prompt delays the others by one chunk
_IDLE_SECONDS = 5.0  # an idle loop frees its context (the KV cells) and its thread
MAX_SEQUENCES = 256  # llama.cpp's LLAMA_MAX_SEQ
_COMPUTE_TURN = threading.Lock()  # held by the one loop of this process decoding now

END = object()  # the last item of a sequence's `out`


class Sequence:
    """One generation inside the loop. The loop fills `out` with chunks, then `END`
    or an exception; everything else here belongs to the loop thread."""

    def __init__(
        self,
        *,
        prompt: list[int],
        tokens: list[int],
        budget: int,
        sampling: Sampling,
        pieces: Utf8Pieces,
        should_stop: Callable[[], bool],
    ) -> None:
        self.prompt = prompt
        self.tokens = tokens
        self.budget = budget
        self.sampling = sampling
        self.pieces = pieces
        self.should_stop = should_stop
        self.out: queue.SimpleQueue[object] = queue.SimpleQueue()
        self.abandoned = threading.Event()  # the consumer stopped reading
        self.seq_id = -1
        self.fed = 0  # prompt + generated tokens already in the KV cache
        self.emitted = len(tokens)

    @property
    def cells(self) -> int:
        """KV cells the sequence may fill: reserved for it when it joins."""
        return len(self.prompt) + self.budget

    def token_at(self, position: int) -> int:
        n_prompt = len(self.prompt)
        return self.prompt[position] if position < n_prompt else self.tokens[position - n_prompt]

    def tail(self, n: int) -> list[int]:
        """The last `n` tokens of prompt + generated text (for the repetition penalty)."""
        if len(self.tokens) >= n:
            return self.tokens[-n:]
        return self.prompt[len(self.prompt) - (n - len(self.tokens)):] + self.tokens

    def stopping(self) -> bool:
        return self.abandoned.is_set() or self.should_stop()

    def waits(self, waiting: bool) -> None:
        """Tell the attempt that the sequence waits for admission (True) or runs."""
        if isinstance(self.should_stop, ExcludesWaits):
            self.should_stop.waiting(waiting)

    def chunk(self, text: str) -> Chunk:
        state = {"v": SNAPSHOT_VERSION, "tokens": list(self.tokens), "seed": self.sampling.seed}
        return Chunk(text, state, Usage(len(self.prompt), len(self.tokens)))


@dataclass(frozen=True)
class LoopShape:
    """What a loop's context is built with."""

    threads: int
    sequences: int
    cells: int  # KV cells shared by all sequences: no sequence may need more


class DecodeLoop:
    """The loop of one loaded model; its thread starts with the first sequence and
    ends (freeing the context) after `_IDLE_SECONDS` without any."""

    def __init__(
        self, model: llama_cpp.LlamaModel, shape: LoopShape, host_lock: Path | None
    ) -> None:
        self._model = model
        self._vocab = model.get_vocab()  # borrowed from the model, which outlives the loop
        self._shape = shape
        self._host_lock = host_lock
        # Reentrant: the model's finalizer calls `close`, and the cycle collector may run
        # it on this loop's own thread while that thread holds the lock.
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._waiting: deque[Sequence] = deque()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.steps = 0  # decode calls so far (tests and benches read it)

    @property
    def running(self) -> bool:
        """Whether the loop's thread runs: sequences in it or waiting to join, or idle
        for less than `_IDLE_SECONDS`."""
        return self._thread is not None

    def close(self) -> None:
        """No sequence will come any more (its model is unloaded): an idle thread ends at
        once instead of after `_IDLE_SECONDS`, freeing the context."""
        with self._lock:
            self._closed = True
            self._changed.notify()

    def submit(self, sequence: Sequence) -> None:
        """Queue `sequence` to join at the next step (thread-safe)."""
        sequence.waits(True)
        with self._lock:
            self._waiting.append(sequence)
            if self._thread is None:
                self._thread = named_thread(self._run, "taskward-decode")
                self._thread.start()
            self._changed.notify()

    def _run(self) -> None:
        try:
            ctx = self._context()
        except EngineError as exc:
            self._end_failing(exc)
            return
        host_lock = self._open_host_lock()
        try:
            _Steps(ctx, self._vocab, self._shape, host_lock, self._take_waiting,
                   self._stepped).run()
        except BaseException as exc:
            log.exception("decode loop failed")  # submit starts a fresh loop thread
            self._end_failing(exc)
        finally:
            host_lock.close()
            ctx.close()

    def _end_failing(self, error: BaseException) -> None:
        """The thread ends on an error: the sequences still waiting get it too."""
        with self._lock:
            self._thread = None
            failed, self._waiting = list(self._waiting), deque()
        for sequence in failed:
            sequence.out.put(error)

    def _open_host_lock(self) -> HostLock:
        try:
            return HostLock(self._host_lock)
        except OSError as exc:
            log.warning("host lock %s unusable (%s): decoding without it",
                        self._host_lock, exc.strerror)
            return HostLock(None)

    def _stepped(self) -> None:
        self.steps += 1

    def _context(self) -> llama_cpp.LlamaContext:
        params = llama_cpp.LlamaContextParams()
        params.n_ctx = self._shape.cells
        params.n_batch = params.n_ubatch = STEP_TOKENS
        params.n_seq_max = self._shape.sequences
        params.kv_unified = True  # any sequence may use any free cell
        params.n_threads = params.n_threads_batch = self._shape.threads
        params.no_perf = True
        try:
            return llama_cpp.LlamaContext(self._model, params)
        except Exception as exc:
            raise EngineError("engine_error",
                              f"cannot create a llama context ({type(exc).__name__})",
                              retryable=True) from exc

    def _take_waiting(
        self, free_ids: list[int], free_cells: int, idle: bool
    ) -> list[Sequence] | None:
        """Admit waiting sequences that fit; None when the loop should end (idle)."""
        with self._lock:
            if idle and not self._waiting:
                if not self._closed:
                    self._changed.wait(_IDLE_SECONDS)
                if not self._waiting:
                    self._thread = None
                    return None
            for sequence in [s for s in self._waiting if s.stopping()]:
                self._waiting.remove(sequence)
                sequence.out.put(END)
            admitted: list[Sequence] = []
            while self._waiting and free_ids and self._waiting[0].cells <= free_cells:
                sequence = self._waiting.popleft()
                sequence.seq_id = free_ids.pop()
                free_cells -= sequence.cells
                sequence.waits(False)
                admitted.append(sequence)
            return admitted


class _Steps:
    """The state of one running loop thread: its context, batch and sequences."""

    def __init__(
        self,
        ctx: llama_cpp.LlamaContext,
        vocab: llama_cpp.LlamaVocab,
        shape: LoopShape,
        host_lock: HostLock,
        take_waiting: Callable[[list[int], int, bool], list[Sequence] | None],
        stepped: Callable[[], None],
    ) -> None:
        self._ctx = ctx
        self._vocab = vocab
        self._host_lock = host_lock
        self._take_waiting = take_waiting
        self._stepped = stepped
        self._batch = llama_cpp.LlamaBatch(n_tokens=STEP_TOKENS, embd=0,
                                           n_seq_max=shape.sequences)
        self._active: list[Sequence] = []
        self._free_ids = list(range(shape.sequences))[::-1]
        self._free_cells = shape.cells

    def run(self) -> None:
        try:
            while True:
                admitted = self._take_waiting(self._free_ids, self._free_cells,
                                              not self._active)
                if admitted is None:
                    return
                for sequence in admitted:
                    self._free_cells -= sequence.cells
                    self._active.append(sequence)
                for sequence in [s for s in self._active if s.stopping()]:
                    self._leave(sequence)
                if self._active:
                    self._step()
        except BaseException as exc:
            for sequence in self._active:  # the context is suspect: no more calls into it
                sequence.out.put(exc)
            raise

    def _step(self) -> None:
        rows = self._fill_batch()
        try:
            with _COMPUTE_TURN, self._host_lock.turn():
                self._ctx.decode(self._batch)
        except Exception as exc:
            error = EngineError("engine_error", f"llama_decode failed ({type(exc).__name__})",
                                retryable=True)
            for sequence in list(self._active):
                self._leave(sequence, error)
            return
        finally:
            self._stepped()
        for sequence, index in rows:
            self._sample(sequence, index)

    def _fill_batch(self) -> list[tuple[Sequence, int]]:
        """Put this step's tokens in the batch; the sequences to sample, with their row."""
        batch = self._batch
        batch.clear()
        rows: list[tuple[Sequence, int]] = []
        n = 0
        prefill_left = _PREFILL_TOKENS
        for sequence in self._active:
            n_prompt = len(sequence.prompt)
            if sequence.fed < n_prompt:
                take = min(prefill_left, n_prompt - sequence.fed)
                prefill_left -= take
            else:
                take = 1  # a replayed token or the newest sampled one
            end = sequence.fed + take
            last = n_prompt + len(sequence.tokens) - 1
            for position in range(sequence.fed, end):
                batch.add(sequence.token_at(position), position, [sequence.seq_id],
                          position == last)
                if position == last:
                    rows.append((sequence, n))
                n += 1
            sequence.fed = end
        return rows

    def _sample(self, sequence: Sequence, index: int) -> None:
        sampling = sequence.sampling
        history = sequence.tail(PENALTY_LAST_N) if sampling.repeat_penalty else []
        try:
            token = sampling.sampler_at(len(sequence.tokens), history).sample(self._ctx, index)
        except Exception as exc:
            self._leave(sequence, EngineError("engine_error",
                                              f"sampling failed ({type(exc).__name__})",
                                              retryable=True))
            return
        if self._vocab.is_eog(token):
            self._finish(sequence)
            return
        sequence.tokens.append(token)
        if text := sequence.pieces.push(token):
            sequence.emitted = len(sequence.tokens)
            sequence.out.put(sequence.chunk(text))
        if len(sequence.tokens) >= sequence.budget:
            self._finish(sequence)

    def _finish(self, sequence: Sequence) -> None:
        if len(sequence.tokens) > sequence.emitted:
            sequence.out.put(sequence.chunk(sequence.pieces.flush()))
        self._leave(sequence)

    def _leave(self, sequence: Sequence, error: BaseException | None = None) -> None:
        self._active.remove(sequence)
        self._ctx.memory_seq_rm(sequence.seq_id, -1, -1)
        self._free_ids.append(sequence.seq_id)
        self._free_cells += sequence.cells
        sequence.out.put(END if error is None else error)
