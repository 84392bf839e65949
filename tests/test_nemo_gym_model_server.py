"""Gym's own model server in front of the SDK's deterministic backend, as real processes.

The backend (``python -m rollout_checkpoint.integrations.nemo_gym.backend``): replies, tool calls
included, are a pure function of seed and conversation, so two backend processes answer one
conversation identically. The checkpointed ``openai_model`` (Gym's ``SimpleModelServer``,
unchanged, as the policy participant) is driven by Gym's unmodified agents, which never send
``x-rc-call-id``: the call identity comes from what Gym sends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from _gym import require_gym
from _procs import kill_mentioning

require_gym()

from rollout_checkpoint.integrations.nemo_gym.backend import (  # noqa: E402
    arguments_for,
    decide,
    model_turns,
    start_backend,
)
from rollout_checkpoint.integrations.nemo_gym.deployment import free_port  # noqa: E402

COUNTER_TOOLS = [
    {
        "type": "function", "name": "increment_counter", "strict": True,
        "parameters": {"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"],
                       "additionalProperties": False},
    },
    {"type": "function", "name": "get_counter_value", "strict": True,
     "parameters": {"type": "object", "properties": {}, "required": [], "additionalProperties": False}},
]  # fmt: skip


@pytest.fixture(autouse=True)
def no_process_left(tmp_path: Path) -> Iterator[None]:
    yield
    left = kill_mentioning(str(tmp_path))  # every process started here has tmp_path on its command line
    assert left == [], f"processes left running: {left}"


def _wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited {proc.returncode}: {log.read_text(errors='replace')[-2000:]}")
        try:
            httpx.get(url, timeout=2, trust_env=False)
            return
        except httpx.HTTPError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer within {timeout:.0f} s")


def _backend_process(tmp_path: Path, seed: int, name: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    log = tmp_path / f"{name}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rollout_checkpoint.integrations.nemo_gym.backend", "--host", "127.0.0.1",
             "--port", str(port), "--seed", str(seed), "--tool-turns", "2"],
            stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path, env={**os.environ, "TMPDIR": str(tmp_path)},
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    _wait_http(f"{url}/v1/models", proc, log)
    return proc, url


def _episode(base_url: str, seed_text: str) -> list[dict[str, Any]]:
    """Drive one tool episode against a backend as Gym's simple_agent would (tool outputs fixed)."""
    items: list[Any] = [{"role": "user", "content": seed_text}]
    replies = []
    for _ in range(6):
        body = {"model": "m", "input": items, "tools": COUNTER_TOOLS}
        r = httpx.post(f"{base_url}/v1/responses", json=body, trust_env=False, timeout=10)
        assert r.status_code == 200, r.text
        reply = r.json()
        replies.append(reply)
        item = reply["output"][0]
        items.append(item)
        if item["type"] != "function_call":
            break
        items.append({"type": "function_call_output", "call_id": item["call_id"], "output": "{}"})
    return replies


@pytest.mark.slow
def test_two_backend_processes_answer_one_conversation_identically_and_end_tool_episodes(
    tmp_path: Path,
) -> None:
    one, url_one = _backend_process(tmp_path, 5, "one")
    two, url_two = _backend_process(tmp_path, 5, "two")
    other, url_other = _backend_process(tmp_path, 6, "other")
    try:
        first, second = _episode(url_one, "add 1 then get"), _episode(url_two, "add 1 then get")
        assert first == second
        kinds = [r["output"][0]["type"] for r in first]
        assert kinds == ["function_call", "function_call", "message"]  # --tool-turns 2, then an answer
        for reply in first[:2]:
            call = reply["output"][0]
            assert call["name"] in {"increment_counter", "get_counter_value"}
            args = json.loads(call["arguments"])
            if call["name"] == "increment_counter":
                assert set(args) == {"count"} and isinstance(args["count"], int)
            else:
                assert args == {}
        for reply in first:  # token receipts: Gym's token fields on every output item
            item = reply["output"][0]
            assert item["prompt_token_ids"] and item["generation_token_ids"]
            assert len(item["generation_log_probs"]) == len(item["generation_token_ids"])
            assert reply["usage"]["input_tokens"] == len(item["prompt_token_ids"])
        assert _episode(url_other, "add 1 then get") != first  # the seed matters
        # vLLM's chat wire format: prompt ids, choice token ids, token_id:<n> logprobs
        chat = httpx.post(
            f"{url_one}/v1/chat/completions", trust_env=False, timeout=10,
            json={"model": "m", "messages": [{"role": "user", "content": "Your hand: [9, 4] = 13"}],
                  "logprobs": True, "top_logprobs": 0, "return_tokens_as_token_ids": True,
                  "return_token_ids": True},
        ).json()  # fmt: skip
        choice = chat["choices"][0]
        assert choice["message"]["content"] == "<action>hit</action>" and choice["finish_reason"] == "stop"
        assert chat["prompt_token_ids"] and choice["token_ids"]
        tokens = [c["token"] for c in choice["logprobs"]["content"]]
        assert tokens == [f"token_id:{t}" for t in choice["token_ids"]]
        # bad input: one clear 400, the backend goes on serving
        bad = httpx.post(f"{url_one}/v1/responses", content=b"[1, 2]", trust_env=False, timeout=10)
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_value"
        bad = httpx.post(f"{url_one}/v1/chat/completions", json={"messages": "x"}, trust_env=False)
        assert bad.status_code == 400
        assert _episode(url_one, "add 1 then get") == first
    finally:
        for proc in (one, two, other):
            proc.terminate()
            proc.wait(10)


def test_the_backend_command_refuses_a_bad_option_in_one_line(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "rollout_checkpoint.integrations.nemo_gym.backend", "--port", "70000"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].endswith("--port in 0..65535")


def test_the_backend_policy_is_a_pure_function_of_seed_and_conversation() -> None:
    items = [{"role": "user", "content": "go"}]
    a = decide(1, items, COUNTER_TOOLS)
    assert a == decide(1, [{"content": "go", "role": "user", "id": None}], COUNTER_TOOLS)  # nulls: ignored
    assert a.tool is not None and decide(1, items, COUNTER_TOOLS, tool_turns=0).tool is None
    # token fields of earlier replies do not change the conversation's identity
    turn = {"type": "function_call", "call_id": "c", "name": "get_counter_value", "arguments": "{}"}
    with_ids = {**turn, "prompt_token_ids": [1], "generation_token_ids": [2], "generation_log_probs": [0.0]}
    assert decide(1, [*items, turn], COUNTER_TOOLS) == decide(1, [*items, with_ids], COUNTER_TOOLS)
    assert len(model_turns([*items, turn, {"type": "function_call_output"}, turn, turn])) == 2
    schema = {
        "type": "object", "required": ["kind", "n", "tags"],
        "properties": {"kind": {"enum": ["a", "b"]}, "n": {"type": "integer", "minimum": 3, "maximum": 4},
                       "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
                       "maybe": {"type": ["number", "null"], "minimum": 1, "maximum": 2}},
    }  # fmt: skip
    for digest in (bytes([i]) * 8 for i in range(20)):
        args = arguments_for(schema, digest)
        assert args["kind"] in ("a", "b") and args["n"] in (3, 4) and len(args["tags"]) == 2
        assert "maybe" not in args or 1 <= args["maybe"] <= 2
        assert arguments_for(schema, digest) == args
    # blackjack: valid actions; a prompt listing <action> choices gets one of them
    hand = [{"role": "user", "content": "Your hand: [10, 9] = 19"}]
    assert decide(0, hand, None).text == "<action>stand</action>"
    prompt = "say <action>left</action> or <action>right</action>"
    listed = decide(0, [{"role": "user", "content": prompt}], None)
    assert listed.text in ("<action>left</action>", "<action>right</action>")


def test_start_backend_serves_in_process() -> None:
    with start_backend(3) as backend:
        r = httpx.post(f"{backend.base_url}/responses", json={"input": "hi"}, trust_env=False, timeout=10)
        assert r.status_code == 200 and r.json()["output"][0]["type"] == "message"
        forbidden = {"input": "hi", "tools": COUNTER_TOOLS, "tool_choice": "none"}
        no_tools = httpx.post(f"{backend.base_url}/responses", json=forbidden, trust_env=False).json()
        assert no_tools["output"][0]["type"] == "message"
        assert backend.calls == 2
        again = httpx.post(f"{backend.base_url}/responses", json={"input": "hi"}, trust_env=False)
        assert again.json() == r.json()


# -- Gym's openai_model, checkpointed, driven by Gym's unmodified agents ------------------------------
VLLM = "vllm_policy"
MODEL, COUNTER, COUNTER_AGENT, MULTI, MULTI_AGENT = (
    "policy_model",
    "counter",
    "counter_agent",
    "multi",
    "multi_agent",
)
_GYM = {  # server name -> how it starts (a launch role, or Gym's own class run by Gym's run_webserver)
    MODEL: ["-m", "rollout_checkpoint.integrations.nemo_gym.launch", "openai-model"],
    VLLM: ["-m", "rollout_checkpoint.integrations.nemo_gym.launch", "model"],  # the config's type picks it
    COUNTER: ["-m", "rollout_checkpoint.integrations.nemo_gym.launch", "resources",
              "resources_servers.example_session_state_mgmt.app:StatefulCounterResourcesServer"],
    COUNTER_AGENT: ["-c", "from responses_api_agents.simple_agent.app import SimpleAgent as S; "
                          "S.run_webserver()"],
    MULTI: ["-c", "from resources_servers.example_multi_turn_gymnasium.app import ExampleMultiTurnEnv as S; "
                  "S.run_webserver()"],
    MULTI_AGENT: ["-c", "from responses_api_agents.gymnasium_agent.app import GymnasiumAgent as S; "
                        "S.run_webserver()"],
}  # fmt: skip


class _Gym:
    """Gym's servers as processes from one Gym config (Gym's usual environment variables)."""

    def __init__(self, tmp_path: Path, backend_url: str) -> None:
        self.dir = tmp_path
        self.token = "t" * 32
        self.store = str(tmp_path / "store")
        self.ports = {name: free_port() for name in _GYM}
        self.gate = tmp_path / "gate"
        self.hold_log = tmp_path / "held.jsonl"
        self.call_log = tmp_path / "calls.jsonl"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        host = "127.0.0.1"
        ref = {"type": "responses_api_models", "name": MODEL}
        self.config = {
            "head_server": {"host": host, "port": free_port()},
            "dry_run": False,
            "observability_enabled": True,
            "model_call_capture_dir": str(tmp_path / "capture"),
            MODEL: {"responses_api_models": {"openai_model": {
                "entrypoint": "app.py", "host": host, "port": self.ports[MODEL],
                "openai_base_url": backend_url, "openai_api_key": "none", "openai_model": "deterministic",
                "call_log": str(self.call_log),
                "hold_file": str(self.gate), "hold_log": str(self.hold_log), "policy_version": "det-v1",
                "extra_body": {"return_token_ids": True}}}},
            VLLM: {"responses_api_models": {"vllm_model": {
                "entrypoint": "app.py", "host": host, "port": self.ports[VLLM], "base_url": backend_url,
                "api_key": "none", "model": "deterministic", "return_token_id_information": True,
                "uses_reasoning_parser": False, "call_log": str(tmp_path / "vllm-calls.jsonl")}}},
            COUNTER: {"resources_servers": {"example_session_state_mgmt": {
                "entrypoint": "app.py", "host": host, "port": self.ports[COUNTER], "domain": "agent"}}},
            COUNTER_AGENT: {"responses_api_agents": {"simple_agent": {
                "entrypoint": "app.py", "host": host, "port": self.ports[COUNTER_AGENT], "max_steps": 8,
                "resources_server": {"type": "resources_servers", "name": COUNTER}, "model_server": ref}}},
            MULTI: {"resources_servers": {"example_multi_turn_gymnasium": {
                "entrypoint": "app.py", "host": host, "port": self.ports[MULTI], "domain": "other"}}},
            MULTI_AGENT: {"responses_api_agents": {"gymnasium_agent": {
                "entrypoint": "app.py", "host": host, "port": self.ports[MULTI_AGENT], "max_steps": 6,
                "resources_server": {"type": "resources_servers", "name": MULTI}, "model_server": ref}}},
        }  # fmt: skip

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def start(self, name: str, *, paused: bool = False) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NEMO_GYM_", "ROLLOUT_CHECKPOINT_"))}
        env.update({
            "NEMO_GYM_CONFIG_DICT": json.dumps(self.config), "NEMO_GYM_CONFIG_PATH": name,
            "ROLLOUT_CHECKPOINT_TOKEN": self.token, "ROLLOUT_CHECKPOINT_STORE": self.store,
            "ROLLOUT_CHECKPOINT_START_PAUSED": "1" if paused else "0", "TMPDIR": str(self.dir),
            "NO_PROXY": "127.0.0.1,localhost", "PYTHONUNBUFFERED": "1",
        })  # fmt: skip
        log = self.dir / f"{name}.log"
        with open(log, "ab") as out:
            self.procs[name] = subprocess.Popen(
                [sys.executable, *_GYM[name]],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait(self, name: str) -> None:
        _wait_http(f"{self.url(name)}/health", self.procs[name], self.dir / f"{name}.log", timeout=180)

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.kill()
            proc.wait(10)

    def lines(self, path: Path) -> list[dict[str, Any]]:
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _counter_row(index: int, rollout_id: str) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": f"add {index} then get"}],
                                    "tools": COUNTER_TOOLS},
        "initial_count": index, "expected_count": index + 3, "_ng_rollout_id": rollout_id,
    }  # fmt: skip


def _wait_for(condition: Any, what: str, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.mark.slow
def test_gyms_openai_model_is_the_policy_participant_for_gyms_unmodified_agents(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from rollout_checkpoint.coordinator import Coordinator
    from rollout_checkpoint.reader import load_checkpoint
    from rollout_checkpoint.registry import LiveExecutionRegistry
    from rollout_checkpoint.server import RemoteParticipant
    from rollout_checkpoint.store import open_store
    from rollout_checkpoint.tokens import ObjectStoreTokenStore

    with start_backend(11, tool_turns=2) as backend:
        gym = _Gym(tmp_path, backend.base_url)
        pool = ThreadPoolExecutor(4)
        try:
            for name in _GYM:  # all at once: their start-ups overlap
                gym.start(name)
            for name in _GYM:
                gym.wait(name)
            model = RemoteParticipant(gym.url(MODEL), token=gym.token)
            # no identity: refused before the backend is asked, with advice that fits the path
            bare = httpx.post(
                f"{gym.url(MODEL)}/v1/responses", json={"input": "hi"}, trust_env=False, timeout=30
            )
            assert bare.status_code == 400 and bare.json()["error"]["code"] == "rollout_id_required"
            assert "observability_enabled" in bare.json()["error"]["detail"]
            bad = httpx.post(
                f"{gym.url(MODEL)}/ng-rollout/x1/v1/responses", json={"input": 5}, trust_env=False
            )
            assert bad.status_code == 422  # Gym's own validation of a malformed body
            assert backend.calls == 0

            # each rollout's second model call waits at the gate: a checkpoint finds them mid-episode
            gym.gate.touch()

            def run(name: str, body: dict[str, Any]) -> httpx.Response:
                return httpx.post(f"{gym.url(name)}/run", json=body, trust_env=False, timeout=300)

            counter = {
                rid: pool.submit(run, COUNTER_AGENT, _counter_row(i, rid))
                for i, rid in [(1, "c1"), (2, "c2")]
            }
            multi_row = {
                "responses_create_params": {"input": [{"role": "user", "content": "What is 15 times 8?"}]},
                "follow_ups": ["Now divide that by 6.", "And add 1."], "expected_answer": "21",
                "_ng_rollout_id": "g1",
            }  # fmt: skip
            multi = pool.submit(run, MULTI_AGENT, multi_row)
            _wait_for(lambda: len(gym.lines(gym.hold_log)) >= 3, "three held second calls")
            held = {(h["rollout_id"], h["call_id"]) for h in gym.lines(gym.hold_log)}
            assert held == {("c1", "turn-2"), ("c2", "turn-2"), ("g1", "turn-2")}  # derived: no x-rc-call-id

            registry = LiveExecutionRegistry()
            for rid in ("c1", "c2", "g1"):
                registry.start(registry.dispatch(rid))
            coordinator = Coordinator(gym.store, [model], registry, ObjectStoreTokenStore(gym.store))
            outcome = coordinator.checkpoint(deadline_s=60)
            plan = load_checkpoint(gym.store, outcome.checkpoint_id)
            reader = plan.readers[("model", MODEL)]
            lineage = {
                (r.rollout_id, r.attempt, r.call_id): r for r in reader.iter_records(kind="model_lineage")
            }
            assert set(lineage) == {("c1", 0, "turn-1"), ("c2", 0, "turn-1"), ("g1", 0, "turn-1")}
            assert {r.policy_version for r in lineage.values()} == {"det-v1"}
            # the token receipts hold the backend's own token ids for the first reply
            tokens = ObjectStoreTokenStore(open_store(gym.store))
            first = decide(11, _counter_row(1, "c1")["responses_create_params"]["input"], COUNTER_TOOLS)
            entry = tokens.get(lineage[("c1", 0, "turn-1")].token_key)
            assert entry.generation_token_ids == first.generation_token_ids
            assert entry.prompt_token_ids == first.prompt_token_ids

            gym.gate.unlink()
            results = {rid: f.result(300) for rid, f in counter.items()}
            for rid, response in results.items():
                assert response.status_code == 200, response.text
                kinds = [o["type"] for o in response.json()["response"]["output"]]
                assert kinds == ["function_call", "function_call_output"] * 2 + ["message"], (rid, kinds)
            assert multi.result(300).status_code == 200
            delivered = [(c["rollout_id"], c["call_id"]) for c in gym.lines(gym.call_log)]
            for rid in ("c1", "c2", "g1"):  # the gymnasium game: question plus one follow-up, then the answer
                assert sorted(c for r, c in delivered if r == rid) == ["turn-1", "turn-2", "turn-3"], (
                    delivered
                )
            # determinism end to end: the same task again (a new rollout) gets the same replies
            again = run(COUNTER_AGENT, _counter_row(1, "c1-again"))
            assert again.status_code == 200
            assert again.json()["response"]["output"] == results["c1"].json()["response"]["output"]
            # the chat dialect (Gym's vllm_model speaks it to its backend): vLLM's token ids kept
            messages = {"messages": [{"role": "user", "content": "Your hand: [9, 9] = 18"}]}
            chat = httpx.post(
                f"{gym.url(MODEL)}/ng-rollout/k1/v1/chat/completions", json=messages, trust_env=False
            )
            assert (
                chat.status_code == 200
                and chat.json()["choices"][0]["message"]["content"] == "<action>stand</action>"
            )
            (logged,) = [c for c in gym.lines(gym.call_log) if c["rollout_id"] == "k1"]
            assert logged["call_id"] == "turn-1" and logged["generation_tokens"] == len(
                chat.json()["choices"][0]["token_ids"]
            )
            # Gym's vllm_model (Responses -> chat completions -> Responses): one delivery per call
            vllm_calls = tmp_path / "vllm-calls.jsonl"
            convo: list[Any] = list(_counter_row(1, "v1")["responses_create_params"]["input"])
            for turn in (1, 2):
                body = {"input": convo, "tools": COUNTER_TOOLS}
                reply = httpx.post(f"{gym.url(VLLM)}/ng-rollout/v1/v1/responses", json=body, trust_env=False)
                assert reply.status_code == 200, reply.text
                (item,) = [o for o in reply.json()["output"] if o["type"] == "function_call"]
                logged = [c for c in gym.lines(vllm_calls) if c["rollout_id"] == "v1"]
                assert [c["call_id"] for c in logged] == [f"turn-{n}" for n in range(1, turn + 1)]
                assert logged[-1]["generation_tokens"] == len(item["generation_token_ids"]) > 0
                convo += [item, {"type": "function_call_output", "call_id": item["call_id"], "output": "{}"}]
            # a late retry of a delivered call is refused (its call id is taken), not recorded twice
            conversation = _counter_row(1, "c1")["responses_create_params"]
            dup = httpx.post(
                f"{gym.url(MODEL)}/ng-rollout/c1/v1/responses", json=conversation, trust_env=False
            )
            assert dup.status_code == 409 and dup.json()["error"]["code"] == "identity_conflict", dup.text
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            gym.stop()


@pytest.mark.slow
def test_a_killed_openai_model_is_restored_and_blackjack_ends_as_if_uninterrupted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gym's openai_model (checkpointed) before the backend, with the checkpointed gymnasium agent
    and blackjack: SIGKILL the model mid-episode, restart it paused, restore, and every rollout
    ends as the uninterrupted run (the backend plays blackjack as the scripted policy does)."""
    from rollout_checkpoint.integrations.nemo_gym import GymServers, run_scenario
    from rollout_checkpoint.integrations.nemo_gym.blackjack import MODEL_NAME

    with start_backend(0) as backend:
        original = GymServers.gym_config

        def with_openai_model(self: GymServers) -> dict[str, Any]:
            config = original(self)
            ((folder, scripted),) = config[MODEL_NAME]["responses_api_models"].items()
            keep = ("entrypoint", "call_log", "hold_file", "hold_log")
            config[MODEL_NAME] = {"responses_api_models": {folder: {
                **{k: scripted[k] for k in keep},
                "checkpoint_class": "rollout_checkpoint.integrations.nemo_gym:CheckpointedOpenAIModel",
                "openai_base_url": backend.base_url,
                "openai_api_key": "none", "openai_model": "deterministic"}}}  # fmt: skip
            return config

        monkeypatch.setattr(GymServers, "gym_config", with_openai_model)
        servers = GymServers(store=str(tmp_path / "store"), workdir=tmp_path / "servers", seed=0)
        result = run_scenario(servers, rollouts=3, kill="model")
        assert backend.calls > 0  # the replies came from the backend, through Gym's openai_model
    summary = result.summary
    assert result.failures == [], (result.failures, summary)
    assert summary["killed"] == "model" and summary["completed"] == summary["rollouts"] == 3
    assert summary["continued"] >= 1 and summary["matches_uninterrupted"] is True
    assert summary["repeated_model_calls"] == 0 and summary["lost_results"] == 0
    assert all(turn >= 1 for turn in summary["resumed_at_turns"].values()), summary["resumed_at_turns"]


def test_call_identity_is_derived_from_what_gyms_agents_send() -> None:
    from rollout_checkpoint.ids import ExecutionId
    from rollout_checkpoint.integrations.nemo_gym.identity import (
        RolloutIdentityRequiredError,
        missing_identity_advice,
        model_call_identity,
    )

    task = [{"role": "user", "content": "play"}]
    call = {"type": "function_call", "call_id": "c", "name": "t", "arguments": "{}"}
    reasoning = {"type": "reasoning", "summary": []}
    answer = {"type": "message", "role": "assistant", "content": "x"}
    # simple_agent: task, then each model turn's items and the tool outputs after them
    assert model_call_identity("r1", None, task) == (ExecutionId(rollout_id="r1", attempt=0), "turn-1")
    convo = [*task, reasoning, call, {"type": "function_call_output", "call_id": "c", "output": "{}"}]
    assert model_call_identity("r1-a2", None, convo) == (ExecutionId(rollout_id="r1", attempt=2), "turn-2")
    # gymnasium_agent: model output, then the next observation as a user message
    game = [*task, answer, {"role": "user", "content": "obs"}, answer, {"role": "user", "content": "obs"}]
    assert model_call_identity("g", None, game)[1] == "turn-3"
    assert model_call_identity("g", "step-7", game)[1] == "step-7"  # the SDK's agents name their calls
    with pytest.raises(RolloutIdentityRequiredError, match="observability_enabled"):
        model_call_identity(None, "step-1", task, path="/v1/responses")
    with pytest.raises(RolloutIdentityRequiredError, match="cannot be numbered"):
        model_call_identity("r1", None, "a bare string")
    # a path that already carries the id gets no advice to turn observability on
    advice = missing_identity_advice("/ng-rollout/r1/v1/responses")
    assert "observability_enabled" not in advice and "agent server" in advice


def test_token_ids_are_read_where_the_wire_format_carries_them() -> None:
    from rollout_checkpoint.integrations.nemo_gym.openai_model import token_ids_of_chat, token_ids_of_response

    items = [
        {"type": "reasoning", "prompt_token_ids": [1, 2], "generation_token_ids": [3],
         "generation_log_probs": [-0.5]},
        {"type": "message", "prompt_token_ids": [1, 2, 3], "generation_token_ids": [4, 5],
         "generation_log_probs": [-0.1, -0.2]},
    ]  # fmt: skip
    ids = token_ids_of_response({"output": items})
    assert (list(ids.prompt), list(ids.generation), list(ids.log_probs)) == (
        [1, 2],
        [3, 4, 5],
        [-0.5, -0.1, -0.2],
    )
    assert token_ids_of_response({"output": [{"type": "message"}]}).generation == []  # none returned: empty
    chat = {
        "prompt_token_ids": [7, 8],
        "choices": [{"token_ids": [9], "logprobs": {"content": [{"token": "token_id:9", "logprob": -0.3}]}}],
    }
    ids = token_ids_of_chat(chat)
    assert (list(ids.prompt), list(ids.generation), list(ids.log_probs)) == ([7, 8], [9], [-0.3])
    only_logprobs = {"choices": [{"logprobs": {"content": [{"token": "token_id:4", "logprob": -1.0}]}}]}
    assert list(token_ids_of_chat(only_logprobs).generation) == [4]
    assert list(token_ids_of_chat({"choices": []}).generation) == []


def test_the_scripted_model_numbers_the_calls_of_gyms_agents_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from fastapi.testclient import TestClient

    from rollout_checkpoint.integrations.nemo_gym.model import ScriptedModelConfig, ScriptedResponsesModel

    monkeypatch.setenv("ROLLOUT_CHECKPOINT_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("ROLLOUT_CHECKPOINT_TOKEN", "t" * 32)
    log = tmp_path / "calls.jsonl"
    config = ScriptedModelConfig.model_construct(
        name="scripted", host="127.0.0.1", port=1, entrypoint="app.py", seed=0, delay_s=0.0,
        call_log=str(log), hold_file=None, hold_from_call=2, hold_log=None, num_workers=None,
        token_id_capture_non_generating_requests=[],
    )  # fmt: skip
    server = ScriptedResponsesModel.model_construct(
        config=config, server_client=SimpleNamespace(global_config_dict={})
    )
    client = TestClient(server.setup_webserver())
    # what Gym's gymnasium agent sends: the conversation so far, no x-rc-call-id
    items: list[Any] = [{"role": "user", "content": "Your hand: [2, 3] = 5"}]
    first = client.post("/ng-rollout/b1/v1/responses", json={"input": items})
    assert (
        first.status_code == 200 and first.json()["output"][0]["content"][0]["text"] == "<action>hit</action>"
    )
    items += [*first.json()["output"], {"role": "user", "content": "Your hand: [2, 3, 10] = 15"}]
    assert client.post("/ng-rollout/b1/v1/responses", json={"input": items}).status_code == 200
    assert [json.loads(line)["call_id"] for line in log.read_text().splitlines()] == ["turn-1", "turn-2"]
    retried = client.post("/ng-rollout/b1/v1/responses", json={"input": items})
    assert retried.status_code == 409 and retried.json()["error"]["code"] == "identity_conflict"
    anonymous = client.post("/v1/responses", json={"input": items}).json()["error"]
    assert anonymous["code"] == "rollout_id_required" and "observability_enabled: true" in anonymous["detail"]
    assert "episode_id" not in anonymous["detail"]  # a model call has no typed body to carry one
    two = config.model_copy(update={"num_workers": 2})
    with pytest.raises(ValueError, match="one process"):  # uvicorn's workers would bypass the participant
        ScriptedResponsesModel.model_construct(
            config=two, server_client=server.server_client
        ).setup_webserver()
