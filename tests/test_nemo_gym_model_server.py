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
