"""Resume racing a synchronous commit on a server with two worker processes (issue 18, D2, over
HTTP): ``run_server(..., workers=2)`` (what ``serve --workers 2`` runs), many seeded races. After
both calls returned, the group and every worker are idle with admission open (never ``committed``
with no checkpoint id, never a group stuck ``preparing``); a commit that lost the race answers
``stale_checkpoint`` (never ``not_found``); a commit that won published a manifest that reads."""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from _procs import worker_server
from rollout_checkpoint.errors import CheckpointError
from rollout_checkpoint.format import ArchiveReader
from rollout_checkpoint.format.layout import component_prefix
from rollout_checkpoint.ids import ExecutionId
from rollout_checkpoint.protocol import CommitReply
from rollout_checkpoint.server import RemoteParticipant
from rollout_checkpoint.store import LocalStore

TOKEN = "tok-phase-races-workers-0123"
RACES = int(os.environ.get("RC_PHASE_RACES", "30"))
ROLLOUTS = [f"r{i}" for i in range(4)]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_resume_racing_a_commit_on_two_workers_leaves_every_phase_consistent(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    store = LocalStore(store_dir)
    rng = random.Random("workers-http")
    outcomes = {"committed": 0, "stale": 0}
    with worker_server(store_dir, 2, token=TOKEN) as server:
        with httpx.Client(
            base_url=server.url, timeout=30, limits=httpx.Limits(max_keepalive_connections=0)
        ) as app:
            for rollout_id in ROLLOUTS:  # sessions on both workers (least loaded placement)
                opened = app.post(f"/ng-rollout/{rollout_id}/sessions", json={"attempt": 0})
                assert opened.status_code == 200, opened.text
        scope = [ExecutionId(rollout_id=r, attempt=0) for r in ROLLOUTS]
        with RemoteParticipant(server.url, token=TOKEN) as control:
            for race in range(RACES):
                cid = f"ck-{race}"
                deadline = time.time() + 60
                assert control.prepare(cid, deadline).ready
                answer: list[object] = []

                def commit(cid: str = cid, deadline: float = deadline, answer: list[object] = answer) -> None:
                    try:
                        answer.append(control.commit(cid, store, deadline, scope))
                    except CheckpointError as exc:
                        answer.append(exc)

                thread = threading.Thread(target=commit)
                thread.start()
                time.sleep(rng.uniform(0.0, 0.06))
                control.resume(cid, deadline)
                thread.join(60)
                [result] = answer
                if isinstance(result, CommitReply):
                    outcomes["committed"] += 1
                    reader = ArchiveReader.open(store, component_prefix(cid, "resources", "counter-0"))
                    # the group's manifest refers to its workers' parts: count stored and referenced
                    kinds = Counter(member.kind for member in reader.members())
                    assert kinds == {"resource_snapshot": len(ROLLOUTS)}
                else:
                    assert isinstance(result, CheckpointError) and result.code == "stale_checkpoint", (
                        race,
                        result,
                    )
                    outcomes["stale"] += 1
                # a commit after the resume (a retry, a late copy) is stale, never not_found
                with pytest.raises(CheckpointError) as late:
                    control.commit(cid, store, deadline, scope)
                assert late.value.code == "stale_checkpoint", (race, late.value)
                status = control.status()
                assert (status.phase.value, status.checkpoint_id, status.accepting, status.workers) == (
                    "idle",
                    None,
                    True,
                    2,
                ), (race, status)
            # the group still checkpoints after every race: nothing was left half-done
            final = f"ck-final-{RACES}"
            deadline = time.time() + 60
            assert control.prepare(final, deadline).ready
            assert control.commit(final, store, deadline, scope).manifest_key
            control.resume(final, deadline)
    assert sum(outcomes.values()) == RACES
