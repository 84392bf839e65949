"""AttemptFence: tombstones refuse every attempt at or below the mark, survive snapshot/load."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_checkpoint.errors import InvalidRecordError, StaleAttemptError
from rollout_checkpoint.format.fencing import AttemptFence
from rollout_checkpoint.ids import ExecutionId


def ex(rollout: str, attempt: int) -> ExecutionId:
    return ExecutionId(rollout_id=rollout, attempt=attempt)


def test_check_refuses_attempts_at_or_below_the_tombstone() -> None:
    fence = AttemptFence()
    fence.check(ex("r", 0))
    fence.retire([ex("r", 2)])
    for attempt in (0, 1, 2):
        with pytest.raises(StaleAttemptError) as info:
            fence.check(ex("r", attempt))
        assert info.value.code == "stale_attempt"
        assert info.value.details["retired_through"] == 2
    fence.check(ex("r", 3))
    fence.check(ex("other", 0))


def test_retire_never_lowers_a_tombstone() -> None:
    fence = AttemptFence()
    fence.retire([ex("r", 5)])
    fence.retire([ex("r", 1)])
    assert fence.highest("r") == 5
    fence.load({"r": 3})
    assert fence.snapshot() == {"r": 5}


def test_forget_drops_the_tombstone() -> None:
    fence = AttemptFence({"r": 1, "s": 0})
    fence.forget(["r", "unknown"])
    fence.check(ex("r", 0))
    assert "r" not in fence and "s" in fence
    assert len(fence) == 1


def test_snapshot_load_round_trip_into_a_fresh_fence() -> None:
    fence = AttemptFence()
    fence.retire([ex("b", 1), ex("a", 0)])
    restored = AttemptFence(fence.snapshot())
    assert restored.snapshot() == {"a": 0, "b": 1}
    assert list(restored.snapshot()) == ["a", "b"]
    with pytest.raises(StaleAttemptError):
        restored.check(ex("b", 1))


@pytest.mark.parametrize(
    "bad",
    [{"r": -1}, {"r": True}, {"r": "1"}, {"../x": 1}, {"": 0}],
)
def test_load_validates_everything_before_merging(bad: dict[str, object]) -> None:
    fence = AttemptFence({"keep": 1})
    with pytest.raises(InvalidRecordError):
        fence.load({"fine": 3, **bad})  # type: ignore[dict-item]
    assert fence.snapshot() == {"keep": 1}


def test_concurrent_retires_keep_the_maximum() -> None:
    fence = AttemptFence()

    def worker(offset: int) -> None:
        for attempt in range(offset, 400, 4):
            fence.retire([ex("r", attempt)])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert fence.highest("r") == 399


operations = st.lists(
    st.tuples(
        st.sampled_from(["retire", "forget", "reload"]),
        st.sampled_from(["r1", "r2", "r3"]),
        st.integers(min_value=0, max_value=6),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(ops=operations, probes=st.lists(st.tuples(st.sampled_from(["r1", "r2", "r3"]), st.integers(0, 7))))
def test_fence_matches_a_max_model(ops: list[tuple[str, str, int]], probes: list[tuple[str, int]]) -> None:
    """Against a plain dict model: retire keeps the max, forget drops, snapshot/load is lossless."""
    fence = AttemptFence()
    model: dict[str, int] = {}
    for op, rollout, attempt in ops:
        if op == "retire":
            fence.retire([ex(rollout, attempt)])
            model[rollout] = max(model.get(rollout, -1), attempt)
        elif op == "forget":
            fence.forget([rollout])
            model.pop(rollout, None)
        else:
            fence = AttemptFence(fence.snapshot())
        assert fence.snapshot() == dict(sorted(model.items()))
    for rollout, attempt in probes:
        stale = rollout in model and attempt <= model[rollout]
        assert fence.is_retired(ex(rollout, attempt)) is stale
        if stale:
            with pytest.raises(StaleAttemptError):
                fence.check(ex(rollout, attempt))
        else:
            fence.check(ex(rollout, attempt))
