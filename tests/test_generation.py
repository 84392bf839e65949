"""The fake generation backend and ``PolicyModelParticipant.generate``: determinism, continuation
from a prefix (inline and staged), concurrency, argument validation."""

from __future__ import annotations

import threading
import time

import pytest

from rollout_checkpoint import (
    CheckpointError,
    ExecutionId,
    FakeGenerationBackend,
    InlinePrefix,
    ObjectStoreTokenStore,
    PolicyModelParticipant,
    StagedPrefix,
    TokenEntry,
    prefix_digest,
)
from rollout_checkpoint.errors import IdentityConflictError, IntegrityError
from rollout_checkpoint.participants import GenerationOutput
from rollout_checkpoint.store import MemoryStore

PROMPT = [5, 6, 7]


def ex(rollout: str = "r1", attempt: int = 0) -> ExecutionId:
    return ExecutionId(rollout_id=rollout, attempt=attempt)


def test_prefix_digest_is_sha256_of_compact_json() -> None:
    import hashlib

    assert prefix_digest([17, 4, 250]) == hashlib.sha256(b"[17,4,250]").hexdigest()
    assert prefix_digest([]) == hashlib.sha256(b"[]").hexdigest()
    with pytest.raises(CheckpointError):
        prefix_digest([1, -2])


def test_backend_is_deterministic_per_seed_and_prompt() -> None:
    a = FakeGenerationBackend(seed=7).generate(PROMPT, 40)
    b = FakeGenerationBackend(seed=7).generate(PROMPT, 40)
    assert a == b and len(a.token_ids) == 40 and a.finish_reason == "length"
    assert FakeGenerationBackend(seed=8).generate(PROMPT, 40).token_ids != a.token_ids
    assert FakeGenerationBackend(seed=7).generate([5, 6, 8], 40).token_ids != a.token_ids
    assert all(0 <= t < 50_000 for t in a.token_ids) and all(p < 0 for p in a.log_probs)


def test_inline_prefix_continues_exactly_and_a_wrong_prefix_diverges() -> None:
    backend = FakeGenerationBackend(seed=3)
    full = backend.generate(PROMPT, 30)
    head = full.token_ids[:12]
    prefix = InlinePrefix(head, full.log_probs[:12], prefix_digest(head))
    continued = backend.generate(PROMPT, 30, prefix=prefix)
    assert continued.token_ids == full.token_ids and continued.log_probs == full.log_probs
    assert continued.prefix_token_count == 12
    # another prefix (honestly digested) leads elsewhere: the continuation really depends on it
    other = (head[0] + 1, *head[1:])
    moved = backend.generate(
        PROMPT, 30, prefix=InlinePrefix(other, full.log_probs[:12], prefix_digest(other))
    )
    assert moved.token_ids[12:] != full.token_ids[12:]
    with pytest.raises(IntegrityError):  # tokens that do not match the digest are refused
        backend.generate(PROMPT, 30, prefix=InlinePrefix(other, full.log_probs[:12], prefix_digest(head)))


def test_staged_prefix_is_read_from_the_token_store() -> None:
    tokens = ObjectStoreTokenStore(MemoryStore("staged-prefix"))
    backend = FakeGenerationBackend(seed=3, token_source=tokens)
    full = backend.generate(PROMPT, 25)
    entry = TokenEntry(
        rollout_id="r1",
        attempt=0,
        call_id="c1.cut9",
        prompt_token_ids=PROMPT,
        generation_token_ids=list(full.token_ids[:9]),
        generation_log_probs=list(full.log_probs[:9]),
        mask=[1] * 9,
    )
    receipt = tokens.put(entry)
    staged = StagedPrefix(receipt.key, 9, prefix_digest(full.token_ids[:9]))
    assert backend.generate(PROMPT, 25, prefix=staged).token_ids == full.token_ids
    with pytest.raises(IntegrityError):
        backend.generate(PROMPT, 25, prefix=StagedPrefix(receipt.key, 9, prefix_digest([1])))
    with pytest.raises(CheckpointError):  # no token source: a staged prefix cannot be read
        FakeGenerationBackend(seed=3).generate(PROMPT, 25, prefix=staged)


def test_cut_swaps_the_active_buffer_and_freezes_the_prefix() -> None:
    backend = FakeGenerationBackend(seed=1, token_delay=0.005)
    generation = backend.open(("r1", 0, "c1"), PROMPT, 200)
    assert generation.cut() is None  # queued: nothing to freeze
    out: list[GenerationOutput] = []
    with backend.slot():
        worker = threading.Thread(target=lambda: out.append(generation.run()))
        worker.start()
        deadline = time.monotonic() + 10
        while backend.stats()["tokens_generated"] < 5 and time.monotonic() < deadline:
            time.sleep(0.001)
        frozen = generation.cut()  # about 1 s of generation is left
        worker.join(30)
    assert frozen is not None and 5 <= frozen.boundary < 200
    assert frozen.digest == prefix_digest(frozen.token_ids)
    assert backend.frozen_buffer(frozen.buffer_id) == frozen
    full = out[0]
    assert full.token_ids[: frozen.boundary] == frozen.token_ids
    assert full.token_ids == FakeGenerationBackend(seed=1).generate(PROMPT, 200).token_ids
    assert generation.cut() is None  # finished: the output is the record
    assert backend.completed_calls() == [("r1", 0, "c1")]


def test_backend_runs_generations_concurrently_up_to_its_limit() -> None:
    backend = FakeGenerationBackend(seed=1, token_delay=0.001, concurrency=3)
    peak = [0]
    active = [0]
    lock = threading.Lock()

    def one(i: int) -> None:
        generation = backend.open(("r", 0, f"c{i}"), [i], 10)
        with backend.slot():
            with lock:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
            generation.run()
            with lock:
                active[0] -= 1

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert peak[0] == 3 and len(backend.completed_calls()) == 8


@pytest.mark.parametrize(
    "kwargs",
    [{"seed": "7"}, {"token_delay": -1}, {"vocab_size": 1}, {"concurrency": 0}, {"concurrency": True}],
)
def test_backend_arguments_are_validated(kwargs: dict[str, object]) -> None:
    with pytest.raises(CheckpointError) as info:
        FakeGenerationBackend(**kwargs)  # type: ignore[arg-type]
    assert info.value.code == "invalid_argument"


def test_generate_delivers_tokens_and_links_lineage() -> None:
    tokens = ObjectStoreTokenStore(MemoryStore("generate"))
    backend = FakeGenerationBackend(seed=11)
    model = PolicyModelParticipant(tokens, "policy", backend=backend, policy_version="v3")
    first = model.generate(ex(), "c1", PROMPT, max_tokens=16)
    second = model.generate(ex(), "c2", [*PROMPT, *first.token_ids], max_tokens=8, policy_version="v4")
    assert first.token_ids == FakeGenerationBackend(seed=11).generate(PROMPT, 16).token_ids
    assert second.lineage.parent_call_id == "c1" and len(second.token_ids) == 8
    assert first.continued_from is None and first.prefix_token_count == 0
    assert [(c.call_id, c.parent_call_id, c.policy_version) for c in model.lineage(ex())] == [
        ("c1", None, "v3"),
        ("c2", "c1", "v4"),
    ]
    assert tokens.get(first.lineage.token_key or "").generation_token_ids == list(first.token_ids)
    assert backend.completed_calls() == [("r1", 0, "c1"), ("r1", 0, "c2")]
    stats = model.stats()
    assert stats["calls_completed"] == 2 and stats["generations_started"] == 2 and stats["inflight"] == 0
    with pytest.raises(IdentityConflictError):
        model.generate(ex(), "c1", PROMPT)


@pytest.mark.parametrize("version", ["", 7, "x" * 257, "bad\x00version"])
def test_policy_version_is_validated_with_a_code(version: object) -> None:
    tokens = ObjectStoreTokenStore(MemoryStore("policy-version"))
    with pytest.raises(CheckpointError) as info:
        PolicyModelParticipant(tokens, backend=FakeGenerationBackend(), policy_version=version)  # type: ignore[arg-type]
    assert info.value.code == "invalid_argument"
    model = PolicyModelParticipant(tokens, backend=FakeGenerationBackend())
    with pytest.raises(CheckpointError) as info:
        model.generate(ex(), "c1", PROMPT, policy_version=version)  # type: ignore[arg-type]
    assert info.value.code == "invalid_argument"
    assert model.stats()["inflight"] == 0 and model.status().live == 0


@pytest.mark.parametrize(
    ("call_id", "prompt", "max_tokens", "code"),
    [
        ("c1.cut5", PROMPT, 4, "invalid_id"),  # reserved for cut prefixes
        ("../x", PROMPT, 4, "invalid_id"),
        ("c1", [1, -1], 4, "invalid_argument"),
        ("c1", PROMPT, 0, "invalid_argument"),
    ],
)
def test_generate_arguments_are_validated(
    call_id: str, prompt: list[int], max_tokens: int, code: str
) -> None:
    model = PolicyModelParticipant(
        ObjectStoreTokenStore(MemoryStore("args")), backend=FakeGenerationBackend()
    )
    with pytest.raises(CheckpointError) as info:
        model.generate(ex(), call_id, prompt, max_tokens=max_tokens)
    assert info.value.code == code


def test_delivery_mode_needs_its_token_access() -> None:
    tokens = ObjectStoreTokenStore(MemoryStore("delivery"))
    with pytest.raises(CheckpointError) as info:
        PolicyModelParticipant(tokens, backend=FakeGenerationBackend(), delivery="staged")
    assert info.value.code == "invalid_argument"
    with pytest.raises(CheckpointError):
        PolicyModelParticipant(tokens, backend=FakeGenerationBackend(), delivery="both")  # type: ignore[arg-type]
