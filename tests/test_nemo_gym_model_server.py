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
        again = httpx.post(f"{backend.base_url}/responses", json={"input": "hi"}, trust_env=False)
        assert again.json() == r.json()


# -- Gym's openai_model, checkpointed, driven by Gym's unmodified agents ------------------------------
MODEL, COUNTER, COUNTER_AGENT, MULTI, MULTI_AGENT = (
    "policy_model",
    "counter",
    "counter_agent",
    "multi",
    "multi_agent",
)
_GYM = {  # server name -> how it starts (a launch role, or Gym's own class run by Gym's run_webserver)
    MODEL: ["-m", "rollout_checkpoint.integrations.nemo_gym.launch", "openai-model"],
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
                "hold_file": str(self.gate), "hold_log": str(self.hold_log), "policy_version": "det-v1"}}},
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
        _wait_http(f"{self.url(name)}/health", self.procs[name], log, timeout=120)

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
            for name in _GYM:
                gym.start(name)
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
            # a late retry of a delivered call is refused (its call id is taken), not recorded twice
            conversation = _counter_row(1, "c1")["responses_create_params"]
            dup = httpx.post(
                f"{gym.url(MODEL)}/ng-rollout/c1/v1/responses", json=conversation, trust_env=False
            )
            assert dup.status_code == 409 and dup.json()["error"]["code"] == "identity_conflict", dup.text
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            gym.stop()
