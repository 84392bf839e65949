"""``RecoveryPlan.rollouts`` as columns: a read-only mapping that builds each plan on access."""

from __future__ import annotations

import pytest

from rollout_checkpoint.reader import RolloutPlan, RolloutPlans


def _plans() -> RolloutPlans:
    return RolloutPlans(
        ["a", "b", "c"],
        [0, 2, 1],
        ["continue", "completed", "fresh_dispatch"],
        ["agree", "acknowledged", "never started"],
        ["running", "handed_off", "queued"],
        [False, False, True],
    )


def test_it_reads_like_the_dict_of_plans_it_replaces() -> None:
    plans = _plans()
    expected = {
        "a": RolloutPlan("a", 0, "continue", "agree", "running", False),
        "b": RolloutPlan("b", 2, "completed", "acknowledged", "handed_off", False),
        "c": RolloutPlan("c", 1, "fresh_dispatch", "never started", "queued", True),
    }
    assert plans == expected and list(plans) == ["a", "b", "c"] and len(plans) == 3
    assert list(plans.values()) == list(expected.values())
    assert list(plans.items()) == list(expected.items())
    assert plans["b"].next_attempt == 2 and plans["c"].next_attempt == 2
    assert "a" in plans and "z" not in plans and 3 not in plans and plans.get("z") is None
    with pytest.raises(KeyError):
        plans["aa"]
    assert plans.counts() == {"completed": 1, "continue": 1, "fresh_dispatch": 1}
    assert plans.with_disposition("fresh_dispatch") == [expected["c"]]
    assert RolloutPlans([], [], [], [], [], []) == {}


@pytest.mark.parametrize("ids", [["b", "a"], ["a", "a"]])
def test_ids_must_be_sorted_and_unique(ids: list[str]) -> None:
    with pytest.raises(ValueError, match="sorted and unique"):
        RolloutPlans(ids, [0, 0], ["continue"] * 2, ["r"] * 2, ["running"] * 2, [False] * 2)


def test_columns_of_different_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="different lengths"):
        RolloutPlans(["a"], [], ["continue"], ["r"], ["running"], [False])
