"""Phase changes are linearizable with respect to resume (issue 18, D2): a resume racing a
synchronous commit never leaves a participant ``committed`` with no active checkpoint. Many
seeded races, for the three reference participant kinds, in process and over HTTP; a commit
that lost the race answers ``stale_checkpoint`` (never ``not_found``)."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from _http import served
from _reference_world import RealWorld
from rollout_checkpoint.errors import CheckpointError
from rollout_checkpoint.protocol import CommitReply, ParticipantControl, Phase
from rollout_checkpoint.server import RemoteParticipant, control_app
from rollout_checkpoint.store import LocalStore

RACES = 40
TOKEN = "tok-phase-races-0123456789"


@contextlib.contextmanager
def _controls(world: RealWorld, store: LocalStore, transport: str) -> Iterator[dict[str, ParticipantControl]]:
    if transport == "in-process":
        yield {p.kind: p for p in world.participants}
        return
    with contextlib.ExitStack() as stack:
        out: dict[str, ParticipantControl] = {}
        for participant in world.participants:
            url = stack.enter_context(served(control_app(participant, token=TOKEN, store=store)))
            out[participant.kind] = stack.enter_context(RemoteParticipant(url, token=TOKEN))
        yield out


@pytest.mark.parametrize("transport", ["in-process", "http"])
@pytest.mark.parametrize("kind", ["model", "agent", "resources"])
def test_resume_racing_a_commit_leaves_a_consistent_phase(tmp_path: Path, kind: str, transport: str) -> None:
    store = LocalStore(tmp_path / "store")
    world = RealWorld(store)
    run = world.start("r")
    world.turn(run, "c1", 1)
    participant = next(p for p in world.participants if p.kind == kind)
    rng = random.Random(f"{kind}-{transport}")
    outcomes: dict[str, int] = {}
    with _controls(world, store, transport) as controls:
        control = controls[kind]
        for race in range(RACES):
            cid = f"ck-{race}"
            deadline = time.time() + 30
            assert control.prepare(cid, deadline).ready
            answer: list[object] = []

            def commit(cid: str = cid, deadline: float = deadline, answer: list[object] = answer) -> None:
                try:
                    answer.append(control.commit(cid, store, deadline, [run]))
                except CheckpointError as exc:
                    answer.append(exc)

            thread = threading.Thread(target=commit)
            thread.start()
            time.sleep(rng.uniform(0.0, 0.02))
            control.resume(cid, deadline)
            thread.join(30)
            [result] = answer
            if isinstance(result, CommitReply):
                outcomes["committed"] = outcomes.get("committed", 0) + 1
            else:
                assert isinstance(result, CheckpointError) and result.code == "stale_checkpoint", result
                outcomes["stale"] = outcomes.get("stale", 0) + 1
            status = participant.status()
            assert (status.phase, status.checkpoint_id, status.accepting) == (Phase.IDLE, None, True), (
                race,
                status,
            )
    assert sum(outcomes.values()) == RACES
    world.close()
