"""A deterministic OpenAI-compatible backend for tests and examples (no GPU, no network).

``python -m rollout_checkpoint.integrations.nemo_gym.backend --host 127.0.0.1 --port P --seed S``
serves what Gym's model servers send to their backend: ``POST /v1/responses`` (Gym's
``openai_model``), ``POST /v1/chat/completions`` (Gym's ``vllm_model`` and ``openai_model``'s chat
route), ``GET /v1/models`` and ``POST /tokenize``. :func:`start_backend` runs the same app in a
thread of the calling process (tests).

Every reply, tool calls included, is a pure function of the seed and the conversation
(:func:`decide`: a SHA-256 of the seed and the canonical JSON of the messages and tools, token
fields and ``null`` values left out), so a resumed run compares exactly with an uninterrupted one:

* while the request offers tools and fewer than ``tool_turns`` model turns of the conversation
  called one, the reply calls a tool chosen by the hash, with arguments built from the tool's
  JSON schema (:func:`arguments_for`: required properties always, enums, bounds and types
  respected);
* otherwise a final message: for Gym's blackjack (a ``Your hand: [...] = N`` observation) a valid
  ``<action>hit</action>`` / ``<action>stand</action>`` (:func:`blackjack_move`); for a prompt
  that lists ``<action>X</action>`` choices, one of them; else a short answer naming the hash.

Token ids come back where the wire format carries them: on every Responses output item (Gym's
``prompt_token_ids`` / ``generation_token_ids`` / ``generation_log_probs``, as Gym's
``vllm_model`` returns them) and, for chat completions, vLLM's ``prompt_token_ids`` plus
``choices[].token_ids`` when the request sets ``return_token_ids`` and ``token_id:<n>`` logprobs
when it sets ``logprobs`` (``return_tokens_as_token_ids``). The tokenizer (:func:`tokenize`) is a
stable hash of word and punctuation pieces into a 32,000-id vocabulary.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from .identity import model_turns

__all__ = [
    "BackendHandle",
    "Reply",
    "arguments_for",
    "blackjack_move",
    "build_backend_app",
    "canonical_conversation",
    "decide",
    "main",
    "model_turns",
    "start_backend",
    "tokenize",
]

VOCAB = 32_000
TOKEN_FIELDS = frozenset(
    {"prompt_token_ids", "generation_token_ids", "generation_log_probs", "routed_experts"}
)
_PIECE = re.compile(r"\w+|[^\w\s]|\s+")
_HAND = re.compile(r"Your hand: \[[^\]]*\] = (\d+)")
_ACTION = re.compile(r"<action>\s*([A-Za-z0-9_ -]{1,40}?)\s*</action>")


# -- the pure part ------------------------------------------------------------------------------------
def _strip(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _strip(v) for k, v in value.items() if v is not None and k not in TOKEN_FIELDS}
    if isinstance(value, (list, tuple)):
        return [_strip(v) for v in value]
    return value


def canonical_conversation(messages: Any, tools: Any) -> bytes:
    """The bytes a reply depends on: messages and tools as sorted, compact JSON, token fields and
    ``null`` values left out (one conversation dumped by two clients hashes the same)."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    body = {"messages": _strip(messages or []), "tools": _strip(tools or [])}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _called_tool(turn: list[Mapping[str, Any]]) -> bool:
    return any(i.get("type") == "function_call" or i.get("tool_calls") for i in turn)


def _text(item: Any) -> str:
    content = item.get("content") if isinstance(item, Mapping) else None
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(c.get("text", "")) for c in content if isinstance(c, Mapping))
    return ""


def blackjack_move(seed: int, items: Sequence[Any]) -> str:
    """Gym's blackjack: hit while the last hand's value is below ``16 + seed % 3``, else stand."""
    value = None
    for item in items:
        match = _HAND.search(_text(item))
        if match is not None:
            value = int(match.group(1))
    action = "hit" if value is not None and value < 16 + seed % 3 else "stand"
    return f"<action>{action}</action>"


@lru_cache(maxsize=65_536)
def _piece_id(piece: str) -> int:
    return int.from_bytes(hashlib.blake2b(piece.encode(), digest_size=4).digest(), "big") % VOCAB


def tokenize(text: str) -> list[int]:
    """Stable token ids: each word, punctuation mark or whitespace run hashed into the vocabulary."""
    return [_piece_id(p) for p in _PIECE.findall(text)]


def _schema_value(schema: Any, rng: random.Random, depth: int = 0) -> Any:
    if not isinstance(schema, Mapping) or depth > 6:
        return None
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        options = schema["enum"]
        return options[int(rng.random() * len(options))]
    for key in ("anyOf", "oneOf"):
        options = [o for o in schema.get(key) or [] if isinstance(o, Mapping) and o.get("type") != "null"]
        if options:
            return _schema_value(options[0], rng, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    if kind == "object" or (kind is None and "properties" in schema):
        return _object_value(schema, rng, depth)
    if kind == "integer":
        low = int(schema.get("minimum", schema.get("exclusiveMinimum", -1) + 1))
        high = int(schema.get("maximum", schema.get("exclusiveMaximum", low + 10) - 1))
        return low + int(rng.random() * (max(high, low) - low + 1))
    if kind == "number":
        bottom = float(schema.get("minimum", 0.0))
        top = float(schema.get("maximum", bottom + 10.0))
        return round(bottom + rng.random() * (top - bottom), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array":
        count = max(int(schema.get("minItems", 1)), 1)
        return [_schema_value(schema.get("items", {"type": "string"}), rng, depth + 1) for _ in range(count)]
    if kind == "null":
        return None
    low = int(schema.get("minLength", 1))
    word = f"v{int(rng.random() * 10_000)}"
    return (word * (low // len(word) + 1))[: max(low, len(word))]


def _object_value(schema: Mapping[str, Any], rng: random.Random, depth: int) -> dict[str, Any]:
    properties = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    out: dict[str, Any] = {}
    for name in sorted(properties):
        if name in required or rng.random() < 0.5:
            out[name] = _schema_value(properties[name], rng, depth + 1)
    return out


def arguments_for(parameters: Any, digest: bytes) -> dict[str, Any]:
    """Arguments for a tool whose JSON schema is ``parameters``, a pure function of ``digest``."""
    rng = random.Random(int.from_bytes(digest[:8], "big"))  # seeded from an int: stable across versions
    value = _object_value(parameters if isinstance(parameters, Mapping) else {}, rng, 0)
    return value


def _tool_name_and_schema(tool: Any) -> tuple[str, Any] | None:
    if not isinstance(tool, Mapping) or tool.get("type", "function") != "function":
        return None
    function = tool.get("function")
    inner: Mapping[str, Any] = function if isinstance(function, Mapping) else tool
    name = inner.get("name")
    return (str(name), inner.get("parameters") or {}) if name else None


@dataclass(frozen=True)
class Reply:
    """One model turn: a final ``text``, or a call of ``tool`` with ``arguments`` (a JSON string)."""

    digest: str
    text: str | None = None
    tool: str | None = None
    arguments: str | None = None
    prompt_token_ids: list[int] = field(default_factory=list)
    generation_token_ids: list[int] = field(default_factory=list)

    @property
    def generation_log_probs(self) -> list[float]:
        return [-(t % 997) / 1000.0 for t in self.generation_token_ids]


def decide(seed: int, messages: Any, tools: Any, *, tool_turns: int = 2) -> Reply:
    """The backend's policy (see the module docstring): a pure function of its arguments."""
    canonical = canonical_conversation(messages, tools)
    digest = hashlib.sha256(f"{seed}\n".encode() + canonical).digest()
    items = messages if isinstance(messages, list) else [{"role": "user", "content": str(messages or "")}]
    prompt = tokenize(canonical.decode())
    offered = [t for t in (_tool_name_and_schema(x) for x in tools or []) if t is not None]
    called = sum(1 for turn in model_turns(items) if _called_tool(turn))
    if offered and called < tool_turns:
        name, schema = offered[digest[0] % len(offered)]
        arguments = json.dumps(arguments_for(schema, digest[1:]), sort_keys=True)
        generated = tokenize(f"{name}({arguments})")
        return Reply(
            digest.hex(),
            tool=name,
            arguments=arguments,
            prompt_token_ids=prompt,
            generation_token_ids=generated,
        )
    every = "\n".join(_text(i) for i in items if isinstance(i, Mapping))
    if _HAND.search(every):
        text = blackjack_move(seed, items)
    elif choices := sorted(set(_ACTION.findall(every))):
        text = f"<action>{choices[digest[0] % len(choices)]}</action>"
    else:
        text = f"Answer {digest.hex()[:12]}."
    return Reply(digest.hex(), text=text, prompt_token_ids=prompt, generation_token_ids=tokenize(text))


# -- the wire formats ---------------------------------------------------------------------------------
def _responses_reply(body: Mapping[str, Any], reply: Reply, token_ids: bool) -> dict[str, Any]:
    short = reply.digest[:24]
    tokens = (
        {
            "prompt_token_ids": reply.prompt_token_ids,
            "generation_token_ids": reply.generation_token_ids,
            "generation_log_probs": reply.generation_log_probs,
        }
        if token_ids
        else {}
    )
    if reply.tool is not None:
        item: dict[str, Any] = {
            "type": "function_call",
            "id": f"fc_{short}",
            "call_id": f"call_{short}",
            "name": reply.tool,
            "arguments": reply.arguments,
            "status": "completed",
        }
    else:
        item = {
            "type": "message",
            "id": f"msg_{short}",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": reply.text, "annotations": []}],
        }
    usage_in, usage_out = len(reply.prompt_token_ids), len(reply.generation_token_ids)
    return {
        "id": f"resp_{short}",
        "object": "response",
        "created_at": 0,
        "status": "completed",
        "model": str(body.get("model") or "deterministic"),
        "output": [{**item, **tokens}],
        "parallel_tool_calls": bool(body.get("parallel_tool_calls", False)),
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": list(body.get("tools") or []),
        "usage": {
            "input_tokens": usage_in,
            "output_tokens": usage_out,
            "total_tokens": usage_in + usage_out,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }


def _chat_reply(body: Mapping[str, Any], reply: Reply) -> dict[str, Any]:
    short = reply.digest[:24]
    message: dict[str, Any] = {"role": "assistant", "content": reply.text}
    if reply.tool is not None:
        message["tool_calls"] = [
            {
                "id": f"call_{short}",
                "type": "function",
                "function": {"name": reply.tool, "arguments": reply.arguments},
            }
        ]
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "finish_reason": "tool_calls" if reply.tool else "stop",
        "logprobs": None,
    }
    if body.get("logprobs"):
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        choice["logprobs"] = {
            "content": [
                {
                    "token": f"token_id:{t}" if as_ids else str(t),
                    "logprob": p,
                    "bytes": None,
                    "top_logprobs": [],
                }
                for t, p in zip(reply.generation_token_ids, reply.generation_log_probs, strict=True)
            ]
        }
    out: dict[str, Any] = {
        "id": f"chatcmpl-{short}",
        "object": "chat.completion",
        "created": 0,
        "model": str(body.get("model") or "deterministic"),
        "choices": [choice],
        "usage": {
            "prompt_tokens": len(reply.prompt_token_ids),
            "completion_tokens": len(reply.generation_token_ids),
            "total_tokens": len(reply.prompt_token_ids) + len(reply.generation_token_ids),
        },
    }
    if body.get("return_token_ids"):
        out["prompt_token_ids"] = reply.prompt_token_ids
        choice["token_ids"] = reply.generation_token_ids
    return out


def _bad_request(message: str) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": "invalid_request_error", "code": "invalid_value"}},
        status_code=400,
    )


async def _json_object(request: Request) -> dict[str, Any] | None:
    try:
        body = json.loads(await request.body())
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def build_backend_app(seed: int = 0, *, tool_turns: int = 2, token_ids: bool = True) -> FastAPI:
    """The backend as an ASGI app (see the module docstring)."""
    app = FastAPI(title="rollout-checkpoint deterministic backend")
    app.state.calls = 0

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": "deterministic", "object": "model", "owned_by": "rollout-checkpoint"}],
        }

    @app.post("/v1/responses")
    async def responses(request: Request) -> Any:
        body = await _json_object(request)
        if body is None or not isinstance(body.get("input"), (str, list)):
            return _bad_request(
                "a Responses request is a JSON object with `input` (a string or a list of items)"
            )
        if body.get("stream"):
            return _bad_request("this backend does not stream")
        app.state.calls += 1
        reply = decide(seed, body["input"], body.get("tools"), tool_turns=tool_turns)
        return _responses_reply(body, reply, token_ids)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        body = await _json_object(request)
        if body is None or not isinstance(body.get("messages"), list):
            return _bad_request("a chat completion request is a JSON object with `messages` (a list)")
        if body.get("stream"):
            return _bad_request("this backend does not stream")
        app.state.calls += 1
        return _chat_reply(body, decide(seed, body["messages"], body.get("tools"), tool_turns=tool_turns))

    @app.post("/tokenize")
    async def tokenize_route(request: Request) -> Any:
        body = await _json_object(request)
        if body is None:
            return _bad_request("a tokenize request is a JSON object with `prompt` or `messages`")
        if isinstance(body.get("prompt"), str):
            tokens = tokenize(body["prompt"])
        elif isinstance(body.get("messages"), list):
            tokens = tokenize(canonical_conversation(body["messages"], body.get("tools")).decode())
        else:
            return _bad_request("a tokenize request needs `prompt` (a string) or `messages` (a list)")
        return {"tokens": tokens, "count": len(tokens), "max_model_len": 1 << 20}

    return app


# -- running it ---------------------------------------------------------------------------------------
@dataclass
class BackendHandle:
    """A backend served by a thread of this process (:func:`start_backend`)."""

    url: str
    app: FastAPI
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def base_url(self) -> str:
        """What Gym's ``openai_base_url`` / ``base_url`` wants: the URL with ``/v1``."""
        return f"{self.url}/v1"

    @property
    def calls(self) -> int:
        """Generation requests answered so far (``/v1/responses`` and ``/v1/chat/completions``)."""
        calls: int = self.app.state.calls
        return calls

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def __enter__(self) -> BackendHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_backend(
    seed: int = 0, *, host: str = "127.0.0.1", port: int = 0, tool_turns: int = 2, token_ids: bool = True
) -> BackendHandle:
    """Serve the backend from a thread; returns once it listens (``port=0``: a free port)."""
    app = build_backend_app(seed, tool_turns=tool_turns, token_ids=token_ids)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        lifespan="off",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="rc-backend", daemon=True)
    thread.start()
    end = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > end:
            server.should_exit = True
            raise RuntimeError(f"the backend did not start on {host}:{port}")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()[1]
    return BackendHandle(url=f"http://{host}:{bound}", app=app, server=server, thread=thread)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rollout_checkpoint.integrations.nemo_gym.backend",
        description="A deterministic OpenAI-compatible backend (replies: a function of seed, conversation).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--tool-turns", type=int, default=2, help="model turns that call a tool before a final answer"
    )
    parser.add_argument(
        "--no-token-ids", action="store_true", help="leave token ids out of Responses output items"
    )
    args = parser.parse_args(argv)
    if args.tool_turns < 0 or not 0 <= args.port < 65536:
        parser.error("--tool-turns must be >= 0 and --port in 0..65535")
    app = build_backend_app(args.seed, tool_turns=args.tool_turns, token_ids=not args.no_token_ids)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
