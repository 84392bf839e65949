"""A deterministic fake generation backend with atomic buffer swaps, for tests and the demo.

Real inference engines (vLLM, Megatron, a TransferQueue buffer) are out of scope; this backend
has the properties a generation cut relies on, so the protocol can be tested end to end:

- **deterministic**: each token is a function of the seed, the prompt and every token before it
  (a rolling sha256 state), so a generation continued from a correct prefix produces exactly
  the tokens an uninterrupted one does, and a wrong prefix produces different ones;
- **concurrent**: up to ``concurrency`` generations run at once (each in its caller's thread,
  ``token_delay`` seconds per token); further ones queue for a slot;
- **cuttable**: :meth:`Generation.cut` atomically swaps the active token buffer and returns the
  frozen pre-cut buffer (immutable, with an id), while the generation keeps going;
- **continuable**: a generation starts after an :class:`InlinePrefix` (token ids the caller
  materialized) or a :class:`StagedPrefix` (a token-store key the backend reads itself); the two
  are distinct types, so one request never carries both.
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

from ..errors import IntegrityError, InvalidArgumentError
from ..tokens import TokenSource, prefix_digest

__all__ = [
    "FakeGenerationBackend",
    "FrozenBuffer",
    "Generation",
    "GenerationOutput",
    "InlinePrefix",
    "StagedPrefix",
]

FinishReason = Literal["length", "cancelled"]

FROZEN_BUFFERS_KEPT = 4096
""":meth:`FakeGenerationBackend.frozen_buffer` remembers this many of the latest frozen buffers."""


@dataclass(frozen=True)
class FrozenBuffer:
    """The immutable pre-cut buffer: every token of the generation before the cut boundary."""

    buffer_id: str
    token_ids: tuple[int, ...]
    log_probs: tuple[float, ...]
    digest: str  # the backend's :func:`~rollout_checkpoint.tokens.prefix_digest` of ``token_ids``

    @property
    def boundary(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class InlinePrefix:
    """A prefix delivered as token ids (materialized and digest-checked by the integration)."""

    token_ids: tuple[int, ...]
    log_probs: tuple[float, ...]
    digest: str


@dataclass(frozen=True)
class StagedPrefix:
    """A prefix delivered by reference: the backend reads it from the token store.

    ``token_key`` names the entry holding the prefix as its generation tokens; the first
    ``prefix_token_count`` of them must hash to ``prefix_digest``.
    """

    token_key: str
    prefix_token_count: int
    prefix_digest: str


@dataclass(frozen=True)
class GenerationOutput:
    token_ids: tuple[int, ...]
    log_probs: tuple[float, ...]
    finish_reason: FinishReason
    prefix_token_count: int  # tokens taken from a continuation prefix, not generated here


@dataclass
class _Buffers:
    frozen: list[FrozenBuffer] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)  # every token so far, prefix included
    log_probs: list[float] = field(default_factory=list)
    active_start: int = 0  # where the active buffer starts within ``tokens``


class Generation:
    """One generation: queued until :meth:`run`, then one token per step in the caller's thread."""

    def __init__(
        self,
        backend: FakeGenerationBackend,
        key: tuple[str, int, str] | None,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        prefix: tuple[tuple[int, ...], tuple[float, ...]],
    ) -> None:
        self.backend = backend
        self.key = key
        self.generation_id = uuid.uuid4().hex[:16]
        self.prompt_token_ids = tuple(prompt_token_ids)
        self.max_tokens = max_tokens
        self.state: Literal["queued", "running", "finished"] = "queued"
        self._lock = threading.Lock()
        self._cancelled = threading.Event()
        self._buf = _Buffers(tokens=list(prefix[0]), log_probs=list(prefix[1]))
        self._prefix_count = len(prefix[0])

    def begin(self) -> None:
        """Mark the generation started (its caller holds a backend slot): from now on it can be cut."""
        with self._lock:
            if self.state != "queued":
                return
            self.state = "running"
        self.backend._count("generations_started")

    def run(self) -> GenerationOutput:
        """Generate up to ``max_tokens`` (the prefix counts). The caller holds a backend
        :meth:`~FakeGenerationBackend.slot`; ``run`` begins the generation if needed."""
        backend = self.backend
        self.begin()
        state = backend._state_after(self.prompt_token_ids, self._buf.tokens)
        finish: FinishReason = "length"
        while True:
            with self._lock:
                if len(self._buf.tokens) >= self.max_tokens:
                    break
            if self._cancelled.is_set():
                finish = "cancelled"
                break
            if backend.token_delay:
                time.sleep(backend.token_delay)
            token, log_prob = backend._token(state)
            state = backend._advance(state, token)
            with self._lock:  # one step is atomic with respect to a cut
                self._buf.tokens.append(token)
                self._buf.log_probs.append(log_prob)
            backend._count("tokens_generated")
        with self._lock:
            self.state = "finished"
            out = GenerationOutput(
                tuple(self._buf.tokens), tuple(self._buf.log_probs), finish, self._prefix_count
            )
        if finish == "length" and self.key is not None:
            backend._completed(self.key)
        return out

    def cut(self) -> FrozenBuffer | None:
        """Atomically freeze every token so far and swap in an empty active buffer.

        ``None`` unless the generation is running (queued: nothing to preserve; finished: its
        output is the durable record). The generation continues into the new active buffer.
        """
        with self._lock:
            if self.state != "running":
                return None
            buf = self._buf
            tokens = tuple(buf.tokens)
            frozen = FrozenBuffer(
                buffer_id=f"{self.generation_id}.b{len(buf.frozen)}",
                token_ids=tokens,
                log_probs=tuple(buf.log_probs),
                digest=self.backend._digest(tokens),
            )
            buf.frozen.append(frozen)
            buf.active_start = len(tokens)
        self.backend._count("cuts")
        self.backend._register_frozen(frozen)
        return frozen

    def cancel(self) -> None:
        """Stop after the current token (a retired attempt's generation is not worth finishing)."""
        self._cancelled.set()


class FakeGenerationBackend:
    """See the module docstring. ``token_source`` is needed only for :class:`StagedPrefix`."""

    def __init__(
        self,
        seed: int = 0,
        *,
        token_delay: float = 0.0,
        vocab_size: int = 50_000,
        concurrency: int = 8,
        token_source: TokenSource | None = None,
    ) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise InvalidArgumentError(f"seed must be an integer, got {seed!r}")
        if not isinstance(token_delay, int | float) or not token_delay >= 0:
            raise InvalidArgumentError(f"token_delay must be >= 0 seconds, got {token_delay!r}")
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 2:
            raise InvalidArgumentError(f"vocab_size must be an integer >= 2, got {vocab_size!r}")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidArgumentError(f"concurrency must be an integer >= 1, got {concurrency!r}")
        self.seed = seed
        self.token_delay = float(token_delay)
        self.vocab_size = vocab_size
        self.concurrency = concurrency
        self.token_source = token_source
        self._slots = threading.BoundedSemaphore(concurrency)
        self._lock = threading.Lock()
        self._stats: dict[str, int] = {
            "generations_started": 0,
            "tokens_generated": 0,
            "prefix_tokens_reused": 0,
            "cuts": 0,
        }
        self._completions: list[tuple[str, int, str]] = []
        self._frozen: dict[str, FrozenBuffer] = {}

    # -- public -------------------------------------------------------------------------------
    def open(
        self,
        key: tuple[str, int, str] | None,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        *,
        prefix: InlinePrefix | StagedPrefix | None = None,
    ) -> Generation:
        """A queued generation for ``key`` = (rollout_id, attempt, call_id), after ``prefix``.

        ``key`` (``None`` for an anonymous generation) is what :meth:`completed_calls` lists.

        The prefix is checked against its digest (a staged one is read from the token store
        first): ``IntegrityError`` when they disagree, so a continuation never starts from
        tokens other than the ones that were cut.
        """
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise InvalidArgumentError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
        tokens, log_probs = self._materialize(prefix)
        if len(tokens) > max_tokens:
            raise InvalidArgumentError(
                f"the prefix has {len(tokens)} tokens, more than max_tokens {max_tokens}"
            )
        if tokens:
            self._count("prefix_tokens_reused", len(tokens))
        return Generation(self, key, prompt_token_ids, max_tokens, (tokens, log_probs))

    def generate(
        self,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        *,
        prefix: InlinePrefix | StagedPrefix | None = None,
    ) -> GenerationOutput:
        """Open and run one anonymous generation outside any participant (a reference run)."""
        generation = self.open(None, prompt_token_ids, max_tokens, prefix=prefix)
        with self.slot():
            return generation.run()

    def frozen_buffer(self, buffer_id: str) -> FrozenBuffer | None:
        """A frozen buffer this backend produced (immutable), or ``None``."""
        with self._lock:
            return self._frozen.get(buffer_id)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {**self._stats, "completed": len(self._completions)}

    def completed_calls(self) -> list[tuple[str, int, str]]:
        """Every (rollout_id, attempt, call_id) whose generation ran to its end, in order."""
        with self._lock:
            return list(self._completions)

    # -- the deterministic generator ------------------------------------------------------------
    def _state_after(self, prompt: Sequence[int], tokens: Sequence[int]) -> bytes:
        state = hashlib.sha256(f"seed={self.seed};prompt={list(prompt)}".encode()).digest()
        for token in tokens:
            state = self._advance(state, token)
        return state

    @staticmethod
    def _advance(state: bytes, token: int) -> bytes:
        return hashlib.sha256(state + token.to_bytes(8, "big")).digest()

    def _token(self, state: bytes) -> tuple[int, float]:
        token = int.from_bytes(state[:8], "big") % self.vocab_size
        log_prob = -(int.from_bytes(state[8:12], "big") % 10_000) / 1_000 - 0.001
        return token, log_prob

    def _digest(self, tokens: Sequence[int]) -> str:
        """Overridable in tests: a backend that reports the wrong digest for a frozen buffer."""
        return prefix_digest(tokens)

    # -- internals ------------------------------------------------------------------------------
    def _materialize(
        self, prefix: InlinePrefix | StagedPrefix | None
    ) -> tuple[tuple[int, ...], tuple[float, ...]]:
        if prefix is None:
            return (), ()
        if isinstance(prefix, InlinePrefix):
            tokens, log_probs, digest = prefix.token_ids, prefix.log_probs, prefix.digest
            where = "inline prefix"
        elif isinstance(prefix, StagedPrefix):
            if self.token_source is None:
                raise InvalidArgumentError("a staged prefix needs a backend with a token_source")
            entry = self.token_source.get(prefix.token_key)
            count = prefix.prefix_token_count
            if count > len(entry.generation_token_ids):
                raise IntegrityError(
                    f"staged prefix {prefix.token_key}: {count} tokens cut, the store holds "
                    f"{len(entry.generation_token_ids)}",
                    key=prefix.token_key,
                )
            tokens = tuple(entry.generation_token_ids[:count])
            log_probs = tuple(entry.generation_log_probs[:count])
            digest, where = prefix.prefix_digest, f"staged prefix {prefix.token_key}"
        else:
            raise InvalidArgumentError(
                f"prefix must be InlinePrefix or StagedPrefix, got {type(prefix).__name__}"
            )
        if len(log_probs) != len(tokens):
            raise IntegrityError(f"{where}: {len(tokens)} tokens but {len(log_probs)} log-probs")
        if prefix_digest(tokens) != digest:
            raise IntegrityError(
                f"{where}: its tokens do not match the cut digest", problem="digest_mismatch"
            )
        return tuple(tokens), tuple(log_probs)

    @contextmanager
    def slot(self) -> Iterator[None]:
        """Hold one of the ``concurrency`` generation slots (blocks while all are busy)."""
        self._slots.acquire()
        try:
            yield
        finally:
            self._slots.release()

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._stats[name] += n

    def _completed(self, key: tuple[str, int, str]) -> None:
        with self._lock:
            self._completions.append(key)

    def _register_frozen(self, frozen: FrozenBuffer) -> None:
        with self._lock:
            self._frozen[frozen.buffer_id] = frozen
            while len(self._frozen) > FROZEN_BUFFERS_KEPT:
                del self._frozen[next(iter(self._frozen))]
