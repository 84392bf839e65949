"""The token store served over HTTP: durable receipts, snapshots the coordinator binds, refusals."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from _http import served
from _protocol_fakes import ScriptedParticipant
from rollout_checkpoint.coordinator import Coordinator
from rollout_checkpoint.errors import ObjectExistsError
from rollout_checkpoint.format.commit_log import read_record
from rollout_checkpoint.registry import LiveExecutionRegistry
from rollout_checkpoint.server import (
    TOKENS_ROUTE_PREFIX,
    RemoteTokenStore,
    UnauthorizedError,
    token_store_app,
)
from rollout_checkpoint.store import LocalStore
from rollout_checkpoint.tokens import ObjectStoreTokenStore, TokenEntry, load_snapshot

TOKEN = "tok-tokens-secret"


def _entry(call_id: str, tokens: list[int]) -> TokenEntry:
    return TokenEntry(
        rollout_id="r1",
        attempt=0,
        call_id=call_id,
        prompt_token_ids=[1, 2],
        generation_token_ids=tokens,
        generation_log_probs=[-0.5] * len(tokens),
        mask=[1] * len(tokens),
    )


def test_remote_token_store_puts_durably_and_snapshots_for_the_coordinator(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    with served(token_store_app(ObjectStoreTokenStore(store), token=TOKEN)) as url:
        remote = RemoteTokenStore(url, token=TOKEN)
        receipt = remote.put(_entry("c1", [7, 8, 9]))
        assert receipt.key == "r1/a0/c1"
        # durable when answered: a fresh reader in another "process" finds it
        assert ObjectStoreTokenStore(store).get("r1/a0/c1").generation_token_ids == [7, 8, 9]
        assert remote.put(_entry("c1", [7, 8, 9])) == receipt  # a retried put is a no-op
        with pytest.raises(ObjectExistsError):
            remote.put(_entry("c1", [1]))  # one call id names one generation
        assert remote.get("r1/a0/c1").generation_token_ids == [7, 8, 9]
        agent = ScriptedParticipant("agent", "agent-0")
        coordinator = Coordinator(store, [agent], LiveExecutionRegistry(), remote, run_id="test-run")
        outcome = coordinator.checkpoint("ck-t", deadline_s=30)
        snapshot = read_record(store, "ck-t")[0].token_snapshot
        assert snapshot is not None and snapshot["entries"] == 1
        assert outcome.clean
        assert remote.name == ObjectStoreTokenStore(store).name
        with RemoteTokenStore(url, token="wrong") as intruder, pytest.raises(UnauthorizedError):
            intruder.snapshot("ck-x")
        bad = {"entries": [{**_entry("c2", [1]).model_dump(), "mask": [1, 1]}]}
        response = httpx.post(
            f"{url}{TOKENS_ROUTE_PREFIX}/put", json=bad, headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert response.status_code == 422 and response.json()["error"]["code"] == "invalid_request"
        agent.close()
    assert list(load_snapshot(store, ObjectStoreTokenStore(store).snapshot("ck-t"))) == ["r1/a0/c1"]
