"""ExportRows / FrozenRows / DeferredExecutions: the rows an incremental export keeps between
checkpoints, the snapshot a freeze takes of them, and the listing built after the freeze."""

from __future__ import annotations

import time

import pytest

from rollout_checkpoint.format.records import AgentBoundaryRecord
from rollout_checkpoint.ids import ExecutionId
from rollout_checkpoint.participants import AgentParticipant
from rollout_checkpoint.protocol import DeferredExecutions, ExportRows, Phase, execution_key
from rollout_checkpoint.store import MemoryStore


def _e(rollout_id: str, attempt: int = 0) -> ExecutionId:
    return ExecutionId(rollout_id=rollout_id, attempt=attempt)


def test_the_snapshot_never_changes_and_is_listed_in_order() -> None:
    rows: ExportRows[ExecutionId, str] = ExportRows(execution_key)
    for r in ("c", "a", "b"):
        rows.set(_e(r), f"row-{r}")
    frozen = rows.freeze(None)
    rows.set(_e("a"), "changed")
    rows.discard(_e("b"))
    rows.set(_e("d"), "new")
    keys, kept = frozen.kept()
    assert [k.rollout_id for k in keys] == ["a", "b", "c"]
    assert kept == ["row-a", "row-b", "row-c"]
    assert list(frozen.executions()) == keys
    later = rows.freeze(None).kept()
    assert [k.rollout_id for k in later[0]] == ["a", "c", "d"] and later[1] == ["changed", "row-c", "new"]


def test_the_order_is_sorted_again_only_when_the_keys_change() -> None:
    rows: ExportRows[ExecutionId, int] = ExportRows(execution_key)
    for i in range(5):
        rows.set(_e(f"r{i}"), i)
    first = rows.freeze(None).kept()[0]
    rows.set(_e("r2"), 20)  # a changed row: same keys, same order object
    assert rows.freeze(None).kept()[0] is first
    rows.discard(_e("r9"))  # not there: nothing changes
    assert rows.freeze(None).kept()[0] is first
    rows.discard(_e("r0"))
    rows.set(_e("r0"), 0)  # removed and added back: sorted again, same result
    again = rows.freeze(None).kept()[0]
    assert again is not first and again == first


@pytest.mark.parametrize("second_attempt", [False, True])
def test_the_scope_filters_by_rollout_and_attempt(second_attempt: bool) -> None:
    rows: ExportRows[ExecutionId, str] = ExportRows(execution_key)
    for e in (_e("a"), _e("b", 1), _e("c"), _e("d")):
        rows.set(e, e.rollout_id)
    scope = {_e("a"), _e("b", 1), _e("d", 2)}
    if second_attempt:  # one rollout twice in the scope: the index by rollout id cannot be used
        scope.add(_e("a", 1))
    keys, kept = rows.freeze(frozenset(scope)).kept()
    assert keys == [_e("a"), _e("b", 1)] and kept == ["a", "b"]


def test_sub_keys_list_each_execution_once() -> None:
    rows: ExportRows[tuple[ExecutionId, str], int] = ExportRows(
        lambda k: (k[0].rollout_id, k[0].attempt, k[1]), lambda k: k[0]
    )
    for r, sid in (("b", "x"), ("a", "y"), ("a", "x"), ("c", "x")):
        rows.set((_e(r), sid), 0)
    frozen = rows.freeze(frozenset({_e("a"), _e("b")}))
    assert [(k[0].rollout_id, k[1]) for k in frozen.kept()[0]] == [("a", "x"), ("a", "y"), ("b", "x")]
    assert list(frozen.executions()) == [_e("a"), _e("b")]


def test_deferred_executions_are_built_once_on_first_use() -> None:
    calls = []

    def build() -> list[ExecutionId]:
        calls.append(1)
        return [_e("a"), _e("b")]

    listed = DeferredExecutions(build)
    assert not listed.built and "not built" in repr(listed) and not calls
    assert len(listed) == 2 and listed[1] == _e("b") and list(listed) == [_e("a"), _e("b")]
    assert listed.built and calls == [1]


def _boundary(e: ExecutionId) -> AgentBoundaryRecord:
    return AgentBoundaryRecord(
        rollout_id=e.rollout_id, attempt=e.attempt, boundary_index=1, turn_index=1, agent_state=b"state"
    )


def test_an_async_commit_lists_its_executions_in_the_committed_reply_not_the_frozen_one() -> None:
    store = MemoryStore("export-rows-async")
    agent = AgentParticipant("agent-0")
    deadline = time.time() + 60
    try:
        for r in ("r2", "r1"):
            agent.begin(_e(r))
            agent.boundary(_e(r), _boundary(_e(r)))
        agent.prepare("ck-1", deadline)
        frozen = agent.commit("ck-1", store, deadline, publication="async")
        assert frozen.phase is Phase.FROZEN and frozen.executions == ()
        agent.resume("ck-1", deadline)
        committed = agent.collect("ck-1", deadline)
        assert committed.executions == (_e("r1"), _e("r2"))
        agent.prepare("ck-2", deadline)
        synced = agent.commit("ck-2", store, deadline)  # a synchronous reply lists them at once
        assert synced.executions == (_e("r1"), _e("r2"))
    finally:
        agent.close()
