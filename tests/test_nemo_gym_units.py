"""The NeMo Gym integration in one process: codecs against Gym's real state classes, spec
lookup, rollout identity, and the awaitable session work of the resources participant."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time

import pytest

from _gym import require_gym

require_gym()

from resources_servers.blackjack.app import BlackjackEnv  # noqa: E402
from resources_servers.example_multi_turn_gymnasium.app import ExampleMultiTurnEnv  # noqa: E402
from resources_servers.example_session_state_mgmt.app import StatefulCounterResourcesServer  # noqa: E402
from resources_servers.indirect_prompt_injection.app import IPIResourcesServer  # noqa: E402
from resources_servers.wordle.app import WordleGameState, WordleResourcesServer  # noqa: E402
from resources_servers.workplace_assistant.app import WorkbenchResourcesServer  # noqa: E402

from _gym_specs import UnauditedMultiTurnEnv  # noqa: E402
from rollout_checkpoint import ExecutionId, ResourcesParticipant  # noqa: E402
from rollout_checkpoint.errors import AdmissionClosedError, StaleAttemptError  # noqa: E402
from rollout_checkpoint.integrations.nemo_gym import specs  # noqa: E402
from rollout_checkpoint.integrations.nemo_gym.codecs import BlackjackCodec, CounterCodec, WordleCodec  # noqa: E402
from rollout_checkpoint.integrations.nemo_gym.identity import (  # noqa: E402
    RolloutIdentityRequiredError,
    execution_from_capture_key,
    execution_from_episode_id,
    execution_from_run_body,
)
from rollout_checkpoint.integrations.nemo_gym.seeded import SeededBlackjackEnv  # noqa: E402


def _response(text: str):  # type: ignore[no-untyped-def]
    from nemo_gym.openai_utils import NeMoGymResponse

    message = {
        "type": "message",
        "id": "m",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    return NeMoGymResponse.model_validate(
        {
            "id": "r",
            "created_at": 0,
            "model": "m",
            "object": "response",
            "output": [message],
            "parallel_tool_calls": False,
            "tool_choice": "auto",
            "tools": [],
        }
    )


async def _play(env: BlackjackEnv, session: str, moves: list[str]) -> list[tuple[object, ...]]:
    out = []
    for move in moves:
        out.append(await env.step(_response(f"<action>{move}</action>"), {}, session))
        if out[-1][2]:
            break
    return out


def test_a_blackjack_session_restored_from_its_bytes_plays_on_exactly_like_the_original() -> None:
    codec = BlackjackCodec()

    async def scenario() -> None:
        original = BlackjackEnv.model_construct(session_state={})
        await original.reset({}, "s")
        await original.step(_response("<action>hit</action>"), {}, "s")  # the RNG has advanced
        if "s" not in original.session_state:
            pytest.skip("the first hit busted: nothing left to continue")  # pragma: no cover
        data = codec.encode(original.session_state["s"])
        restored = BlackjackEnv.model_construct(session_state={"s": codec.decode(data)})
        moves = ["hit", "hit", "stand"]
        assert await _play(restored, "s", moves) == await _play(original, "s", moves)

    random.seed(7)
    asyncio.run(scenario())


def test_the_blackjack_codec_refuses_states_gym_never_keeps() -> None:
    codec = BlackjackCodec()
    good = json.loads(codec.encode({"player": ["A", "7"], "dealer": ["K", "2"], "rng": random.Random(1)}))
    bad_words = {**good, "rng": {**good["rng"], "words": good["rng"]["words"][:-1]}}
    for doc in (
        {**good, "extra": 1},
        {**good, "player": ["A", "1"]},
        {**good, "dealer": []},
        bad_words,
        {**good, "rng": {**good["rng"], "version": 2}},
    ):
        with pytest.raises(ValueError):
            codec.decode(json.dumps(doc).encode())
    with pytest.raises(TypeError):
        codec.encode({"player": ["A"], "dealer": ["2"], "rng": "not an rng"})


def test_wordle_and_counter_states_round_trip_through_their_codecs() -> None:
    state = WordleGameState(target_word="crane", word_length=5, max_turns=6)
    state.guesses.append("slate")
    state.feedback_history.append(["_", "_", "G", "_", "G"])
    state.known_greens.update({2: "a", 4: "e"})
    state.known_yellows.add("r")
    state.eliminated_letters.update({"s", "l", "t"})
    state.turn, state.total_reward = 1, -0.05
    codec = WordleCodec()
    assert codec.decode(codec.encode(state)) == state
    with pytest.raises(ValueError):
        codec.decode(codec.encode(state).replace(b'"turn"', b'"turns"'))
    counter = CounterCodec()
    assert counter.decode(counter.encode(41)) == 41
    with pytest.raises(ValueError):
        counter.decode(b'{"count": "41"}')


def test_specs_are_found_for_the_built_in_servers_and_their_subclasses_only_on_the_tested_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def of(cls: type) -> object:
        return specs.spec_for(cls.model_construct())

    assert of(BlackjackEnv) is specs.BLACKJACK
    assert of(SeededBlackjackEnv) is specs.BLACKJACK
    assert of(WordleResourcesServer) is specs.WORDLE
    assert of(StatefulCounterResourcesServer) is specs.COUNTER
    assert of(ExampleMultiTurnEnv) is specs.MULTI_TURN
    assert of(WorkbenchResourcesServer) is specs.WORKPLACE_ASSISTANT
    assert of(IPIResourcesServer) is specs.INDIRECT_PROMPT_INJECTION
    assert of(UnauditedMultiTurnEnv) is None  # a server of one's own without a spec: restart-only
    assert specs.gym_version() == specs.GYM_VERSION_TESTED
    monkeypatch.setattr(specs, "gym_version", lambda: "9.9.9")
    assert of(BlackjackEnv) is None  # another Gym version: fail closed


def test_rollout_identity_follows_gyms_capture_keys_and_run_bodies() -> None:
    assert execution_from_capture_key("r7") == ExecutionId(rollout_id="r7", attempt=0)
    assert execution_from_capture_key("r7-a3") == ExecutionId(rollout_id="r7", attempt=3)
    assert execution_from_capture_key("r7-a0") == ExecutionId(rollout_id="r7-a0", attempt=0)
    assert execution_from_episode_id({"rollout_id": "r", "attempt": 2}) == ExecutionId(
        rollout_id="r", attempt=2
    )
    assert execution_from_episode_id({"attempt": 2}) is None
    with pytest.raises(RolloutIdentityRequiredError):
        execution_from_episode_id({"rollout_id": "r-a2", "attempt": 0})  # Gym reserves the suffix
    assert execution_from_run_body({"_ng_rollout_id": "x", "_ng_attempt_index": 1}) == ExecutionId(
        rollout_id="x", attempt=1
    )
    assert execution_from_run_body({"_ng_task_index": 3, "_ng_rollout_index": 4}) == ExecutionId(
        rollout_id="3-4", attempt=0
    )
    assert execution_from_run_body({}) is None


def test_async_session_work_parks_while_admission_is_closed_and_blocks_prepare_while_it_runs() -> None:
    participant = ResourcesParticipant("gym", mode="exported")
    run = ExecutionId(rollout_id="r1", attempt=0)
    release = asyncio.Event

    async def scenario() -> None:
        async with participant.session_work(run, "s1") as work:
            assert not work.exists
            assert work.set({"n": 0}) == 0
        gate = release()
        entered = asyncio.Event()

        async def slow_mutation() -> None:
            async with participant.session_work(run, "s1") as work:
                entered.set()
                await gate.wait()
                work.set({"n": work.state["n"] + 1})

        task = asyncio.create_task(slow_mutation())
        await entered.wait()
        report = await asyncio.to_thread(participant.prepare, "ck-1", time.time() + 0.3)
        assert not report.ready and report.blocker_count == 1  # the mutation in flight
        gate.set()
        await task
        report = await asyncio.to_thread(participant.prepare, "ck-1", time.time() + 5)
        assert report.ready
        waiting = asyncio.create_task(_mutate(participant, run, wait=5))
        await asyncio.sleep(0.2)
        assert not waiting.done()  # parked (no thread held) while admission is closed
        with pytest.raises(AdmissionClosedError):
            await _mutate(participant, run, wait=0)
        threading.Thread(target=participant.resume, args=("ck-1", time.time() + 5)).start()
        assert await waiting == 2
        participant.retire([run], time.time() + 5)
        with pytest.raises(StaleAttemptError):
            await _mutate(participant, run, wait=0)

    asyncio.run(scenario())


async def _mutate(participant: ResourcesParticipant, run: ExecutionId, *, wait: float) -> int:
    async with participant.session_work(run, "s1", wait=wait) as work:
        return work.set({"n": work.state["n"] + 1})


def _guess(word: str) -> dict[str, object]:
    call = {
        "type": "function_call",
        "id": "fc",
        "call_id": "c1",
        "name": "submit_guess",
        "arguments": json.dumps({"guess": word}),
        "status": "completed",
    }
    response = {
        "id": "r",
        "created_at": 0,
        "model": "m",
        "object": "response",
        "output": [call],
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
    }
    return {"responses_create_params": {"input": "play"}, "response": response}


def _wordle_app(tmp_path: object) -> tuple[object, object, object]:
    from types import SimpleNamespace

    from fastapi.testclient import TestClient

    from rollout_checkpoint.integrations.nemo_gym import attach

    server = WordleResourcesServer.model_construct(session_state={}, config=SimpleNamespace(name="wordle"))
    app = server.setup_webserver()
    participant = attach(server, app, token="wordle-test-token-0123456789", store=str(tmp_path))
    return server, participant, TestClient(app)


def test_gyms_wordle_app_with_the_participant_attached_restores_its_game_into_a_fresh_server(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pathlib import Path

    import resources_servers.wordle.app as wordle

    # Gym's wheel ships no word list (its generator downloads one): a small list of our own
    monkeypatch.setattr(wordle, "valid_guesses", lambda: frozenset({"crane", "slate", "flint"}))

    store = str(Path(str(tmp_path)) / "store")
    server, participant, client = _wordle_app(store)
    base = "/ng-rollout/w1"
    reset = client.post(
        f"{base}/reset", json={"responses_create_params": {"input": "play"}, "custom_target": "crane"}
    )
    assert reset.status_code == 200 and reset.headers["x-rc-revision"] == "0"
    step = client.post(f"{base}/step", json=_guess("slate"))
    assert step.status_code == 200 and step.json()["terminated"] is False
    assert step.headers["x-rc-revision"] == "1"
    anonymous = client.post("/step", json=_guess("crane"))
    assert anonymous.status_code == 400 and anonymous.json()["error"]["code"] == "rollout_id_required"
    deadline = time.time() + 30
    assert participant.prepare("ck-w", deadline).ready
    participant.commit("ck-w", store, deadline)
    participant.resume("ck-w", deadline)
    session_id = step.headers["x-rc-session"]
    saved = server.session_state[session_id]

    fresh_server, fresh, fresh_client = _wordle_app(store)  # the replacement process
    fresh.restore("rs-w", "ck-w", store, time.time() + 30)
    fresh.resume("rs-w", time.time() + 30)
    assert fresh_server.session_state[session_id] == saved  # back in Gym's own dict
    fresh_client.cookies.update(client.cookies)  # the agent kept its cookie across the crash
    win = fresh_client.post("/ng-rollout/w1-a1/step", json=_guess("crane"))
    assert win.status_code == 200 and win.json()["info"]["game_outcome"] == "win"
    stale = fresh_client.post(f"{base}/step", json=_guess("crane"))
    assert stale.status_code == 409 and stale.json()["error"]["code"] == "stale_attempt"
