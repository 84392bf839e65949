"""Gym's simple agent through a SIGKILL, in one command.

    python examples/nemo_gym_simple_agent.py [--env workplace_assistant|example_session_state_mgmt]
        [--rollouts N] [--seed S] [--workers N] [--kill agent|resources|model|none] [--store URL] [--json]

Starts, from one Gym config and as real processes on 127.0.0.1 (the SDK's public
``GymDeployment``, each server through Gym's own start-up): Gym's ``simple_agent`` in its
checkpointed form (``CheckpointedSimpleAgent``), Gym's ``openai_model`` server checkpointed as the
policy model (``CheckpointedOpenAIModel``) in front of the SDK's deterministic OpenAI-compatible
backend (its replies, tool calls included, are a pure function of the seed and the
conversation), and the ``--env`` tool server with the checkpoint participant attached
(``--workers`` worker processes): Gym's ``workplace_assistant`` (the task rows Gym ships with
it; its DataFrames restored from Parquet) or the ``example_session_state_mgmt`` counter. It
first runs every task row uninterrupted (the reference), then runs them again with each
rollout's second model call held at the model (so every rollout is mid-episode, after its first
model call and tool call), checkpoints, SIGKILLs the ``--kill`` server, restarts it paused,
recovers with ``Coordinator.recover()``, finishes every rollout (continued ones as attempt N+1
from their boundary) and compares each with the reference.

With ``--json`` the last line is one JSON object (the keys of ``nemo_gym_blackjack.py``, with
``resumed_at_turns``: the turn each continued rollout resumed at). Exit status 0 only for a
correct run: every rollout completed, nothing lost, no completed model or tool call repeated,
results equal to the uninterrupted run.

Needs NeMo Gym installed beside the SDK (see docs/nemo-gym.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

COUNTER_TOOLS = [
    {
        "type": "function",
        "name": "increment_counter",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"count": {"type": "integer"}},
            "required": ["count"],
            "additionalProperties": False,
        },
    },
    {
        "type": "function",
        "name": "get_counter_value",
        "strict": True,
        "parameters": {"type": "object", "properties": {}, "required": [], "additionalProperties": False},
    },
]


def _counter_row(index: int) -> dict[str, Any]:
    return {
        "responses_create_params": {
            "input": [{"role": "user", "content": f"Start at {index}, add twice, then read the counter."}],
            "tools": COUNTER_TOOLS,
        },
        "initial_count": index,
        "expected_count": index + 3,
    }


def _gym_example_row(package: str) -> Any:
    """Task rows from the ``data/example.jsonl`` Gym ships with a resources server (index i takes
    row ``i`` modulo their number)."""

    def row(index: int) -> dict[str, Any]:
        import importlib

        module = importlib.import_module(f"resources_servers.{package}.app")
        rows = (Path(str(module.__file__)).parent / "data" / "example.jsonl").read_text().splitlines()
        return dict(json.loads(rows[index % len(rows)]))

    return row


# --env: the tool server (a Gym resources server class with a built-in spec), its task rows
ENVS: dict[str, dict[str, Any]] = {
    "workplace_assistant": {
        "folder": "workplace_assistant",
        "class": "resources_servers.workplace_assistant.app:WorkbenchResourcesServer",
        "row": _gym_example_row("workplace_assistant"),
        "tool_turns": 3,
        "probe_route": "/email_search_emails",
    },
    "example_session_state_mgmt": {
        "folder": "example_session_state_mgmt",
        "class": "resources_servers.example_session_state_mgmt.app:StatefulCounterResourcesServer",
        "row": _counter_row,
        "tool_turns": 3,  # three tool-calling model calls, then an answer: four steps
        "probe_route": "/get_counter_value",  # a late tool call of a restored-over attempt
    },
}
MAX_STEPS = 8
MODEL, TOOLS, AGENT = "policy_model", "tool_server", "simple_agent"


def gym_config(env: str, work: Path, workers: int) -> dict[str, Any]:
    spec = ENVS[env]
    model_ref = {"type": "responses_api_models", "name": MODEL}
    return {
        "dry_run": False,
        "observability_enabled": True,
        "model_call_capture_dir": str(work / "capture"),
        MODEL: {
            "responses_api_models": {
                "openai_model": {
                    "entrypoint": "app.py",
                    "checkpoint_class": "rollout_checkpoint.integrations.nemo_gym:CheckpointedOpenAIModel",
                    "openai_base_url": "",  # set once the backend listens
                    "openai_api_key": "none",
                    "openai_model": "deterministic",
                    "call_log": str(work / "model-calls.jsonl"),
                    "hold_file": str(work / "model-gate"),
                    "hold_log": str(work / "model-held.jsonl"),
                }
            }
        },
        TOOLS: {
            "resources_servers": {
                spec["folder"]: {
                    "entrypoint": "app.py",
                    "domain": "agent",
                    "checkpoint_class": spec["class"],
                    "num_workers": workers,
                }
            }
        },
        AGENT: {
            "responses_api_agents": {
                "simple_agent": {
                    "entrypoint": "app.py",
                    "checkpoint_class": "rollout_checkpoint.integrations.nemo_gym:CheckpointedSimpleAgent",
                    "resources_server": {"type": "resources_servers", "name": TOOLS},
                    "model_server": model_ref,
                    "max_steps": MAX_STEPS,
                }
            }
        },
    }


def _lines(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):  # a line still being appended
            out.append(json.loads(line))
    return out


class Runs:
    """``/run`` requests to the agent, one thread each."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.replies: dict[Any, dict[str, Any]] = {}
        self.lock = threading.Lock()

    def dispatch(self, execution: Any, row: dict[str, Any]) -> None:
        import httpx

        body = {**row, "_ng_rollout_id": execution.rollout_id, "_ng_attempt_index": execution.attempt}

        def post() -> None:
            try:
                r = httpx.post(f"{self.url}/run", json=body, timeout=600, trust_env=False)
                reply = {"status": r.status_code, "body": r.json() if r.status_code == 200 else r.text[:300]}
            except Exception as exc:  # the agent died under the request
                reply = {"status": 0, "body": f"{type(exc).__name__}: {exc}"}
            with self.lock:
                self.replies[execution] = reply

        threading.Thread(target=post, daemon=True).start()

    def wait(self, executions: list[Any], deadline: float) -> None:
        while time.monotonic() < deadline and any(e not in self.replies for e in executions):
            time.sleep(0.05)


def episode(body: dict[str, Any]) -> dict[str, Any]:
    """What a rollout did, as the trainer sees it: tool calls, tool outputs, answers, reward
    (``nemo_gym_eval_run.py`` compares its collections with it too)."""
    items = []
    for item in body["response"]["output"]:
        if item["type"] == "function_call":
            items.append(["call", item["name"], item["arguments"]])
        elif item["type"] == "function_call_output":
            items.append(["output", item["output"]])
        elif item["type"] == "message":
            items.append(["text", "".join(c.get("text", "") for c in item.get("content", []))])
    return {"items": items, "reward": body["reward"]}


def run(args: argparse.Namespace, work: Path, store: str) -> dict[str, Any]:
    import httpx

    from rollout_checkpoint.integrations.nemo_gym import GymDeployment, start_backend
    from rollout_checkpoint.reader import load_checkpoint
    from rollout_checkpoint.registry import LiveExecutionRegistry

    spec = ENVS[args.env]
    config = gym_config(args.env, work, args.workers)
    failures: list[str] = []
    rows = {
        f"{args.env.split('_')[0]}{args.seed}-{i}": spec["row"](args.seed * 100 + i)
        for i in range(args.rollouts)
    }
    kill = None if args.kill == "none" else args.kill
    with start_backend(args.seed, tool_turns=spec["tool_turns"]) as backend:
        config[MODEL]["responses_api_models"]["openai_model"]["openai_base_url"] = backend.base_url
        dep = GymDeployment(config, workdir=work, store=store, env={"TMPDIR": str(work)})
        try:
            dep.start_all()
            registry = LiveExecutionRegistry()
            coordinator = dep.coordinator(registry)
            runs = Runs(dep.url("agent"))
            deadline = time.monotonic() + 600
            # 1. the reference: every row, uninterrupted (rollout ids ref-*); then retired
            refs = {r: registry.dispatch(f"ref-{r}") for r in rows}
            for rollout_id, execution in refs.items():
                registry.start(execution)
                runs.dispatch(execution, rows[rollout_id])
            runs.wait(list(refs.values()), deadline)
            reference = {}
            for rollout_id, execution in refs.items():
                reply = runs.replies.get(execution, {"status": 0, "body": "no reply"})
                if reply["status"] != 200:
                    raise RuntimeError(f"the uninterrupted run of {rollout_id} failed: {reply}")
                reference[rollout_id] = episode(reply["body"])
                registry.finish(execution)
                registry.hand_off(execution, {}, reward=float(reply["body"]["reward"]))
            coordinator.retire(refs.values())  # Gym's /run leaves the tool server's session open
            coordinator.checkpoint(deadline_s=60)  # warm-up, not counted in the pauses
            # 2. every rollout held at its second model call: mid-episode, at boundary 1
            gate = work / "model-gate"
            gate.touch()
            live = {r: registry.dispatch(r) for r in rows}
            for rollout_id, execution in live.items():
                registry.start(execution)
                runs.dispatch(execution, rows[rollout_id])
            while time.monotonic() < deadline:
                held = {(c["rollout_id"], c["attempt"]) for c in _lines(work / "model-held.jsonl")}
                if all((e.rollout_id, e.attempt) in held or e in runs.replies for e in live.values()):
                    break
                time.sleep(0.05)
            outcome = coordinator.checkpoint(deadline_s=60)
            pauses = [outcome.pause_seconds * 1000]
            timings = [{k: round(v * 1000, 1) for k, v in outcome.timings.items()}]
            plan = load_checkpoint(store, outcome.checkpoint_id)
            counts: dict[str, int] = {}  # the dispositions of this run's rollouts (not the reference's)
            for rollout_id in rows:
                disposition = plan.rollouts[rollout_id].disposition
                counts[disposition] = counts.get(disposition, 0) + 1
            stale_status = None
            killed = False
            resumed: dict[str, Any] = dict(live)
            if kill:
                dep.kill(kill)
                dep.restart(kill)  # paused: it admits nothing until the restore
                running = [e for e in live.values() if e not in runs.replies]
                restored = dep.recover(
                    coordinator, running, checkpoint_id=outcome.checkpoint_id, deadline_s=120, resume=False
                )
                gate.unlink()
                coordinator.resume(restored.restore_id, deadline_s=60)
                killed = True
                for rollout_id, entry in restored.plan.rollouts.items():
                    if rollout_id not in live or entry.disposition == "completed":
                        continue
                    nxt = entry.execution.next_attempt()
                    if entry.disposition == "fresh_dispatch":
                        registry.start(nxt)
                    resumed[rollout_id] = nxt
                    runs.dispatch(nxt, rows[rollout_id])
                    if entry.disposition == "continue" and stale_status is None:
                        late = httpx.post(  # a late tool call of the restored-over attempt
                            f"{dep.url('resources')}/ng-rollout/{entry.execution.capture_key}{spec['probe_route']}",
                            json={},
                            timeout=30,
                            trust_env=False,
                        )
                        stale_status = late.status_code
            else:
                gate.unlink()
            runs.wait(list(resumed.values()), deadline)
            calls = _lines(work / "model-calls.jsonl")
        finally:
            dep.stop()
    results = {r: runs.replies.get(e) for r, e in resumed.items()}
    return _summary(
        rows, results, reference, calls, counts, pauses, timings, kill, killed, stale_status, failures
    ) | {"failures": failures}


def _summary(
    rows: dict[str, Any],
    results: dict[str, Any],
    reference: dict[str, Any],
    calls: list[dict[str, Any]],
    counts: dict[str, int],
    pauses: list[float],
    timings: list[dict[str, float]],
    kill: str | None,
    killed: bool,
    stale_status: int | None,
    failures: list[str],
) -> dict[str, Any]:
    completed = matches = repeated_tools = repeated_models = 0
    turns: dict[str, int] = {}
    seen: set[tuple[str, int, str]] = set()
    for call in calls:
        key = (call["rollout_id"], call["attempt"], call["call_id"])
        repeated_models += key in seen
        seen.add(key)
    for rollout_id in rows:
        reply = results.get(rollout_id)
        if not reply or reply["status"] != 200:
            failures.append(f"{rollout_id} has no result: {reply}")
            continue
        completed += 1
        body = reply["body"]
        meta = body["rollout_checkpoint"]
        restored_turn = meta["restored_turn"]
        if restored_turn is not None:
            turns[rollout_id] = restored_turn
            attempt = meta["attempt"]
            repeated_tools += sum(
                1 for s in meta["steps"] if s["attempt"] == attempt and s["step"] <= restored_turn
            )
            repeated_models += sum(
                1
                for c in calls
                if c["rollout_id"] == rollout_id
                and c["attempt"] == attempt
                and int(str(c["call_id"]).rsplit("-", 1)[-1]) <= restored_turn
            )
        if episode(body) == reference[rollout_id]:
            matches += 1
        else:
            failures.append(f"{rollout_id} differs from the uninterrupted run: {episode(body)}")
    if repeated_models or repeated_tools:
        failures.append(f"repeated model calls {repeated_models}, tool calls {repeated_tools}")
    shown = {
        "crash": killed,
        "rollouts_continued": killed and bool(counts.get("continue")),
        "resumed_mid_episode": any(t >= 1 for t in turns.values()),
    }
    why = {
        "crash": "no crash was asked for (--kill none)",
        "rollouts_continued": "the run restored no checkpoint" if not killed else "no rollout to continue",
        "resumed_mid_episode": "the run restored no checkpoint"
        if not killed
        else "every continued rollout resumed at turn 0",
    }
    return {
        "ok": not failures,
        "rollouts": len(rows),
        "completed": completed,
        "continued": counts.get("continue", 0) if killed else 0,
        "fresh_dispatch": counts.get("fresh_dispatch", 0) if killed else 0,
        "completed_at_checkpoint": counts.get("completed", 0),
        "repeated_model_calls": repeated_models,
        "repeated_tool_calls": repeated_tools,
        "lost_results": len(rows) - completed,
        "matches_uninterrupted": matches == len(rows),
        "compared": True,
        "pause_ms_p50": round(statistics.median(pauses), 1) if pauses else None,
        "checkpoints": len(pauses),
        "killed": kill,
        "restored_turns": dict(turns),
        "resumed_at_turns": dict(turns),
        "stale_attempt_status": stale_status,
        "checkpoint_timings_ms": timings,
        "demonstrated": shown,
        "not_demonstrated": {k: why[k] for k, v in shown.items() if not v},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", choices=sorted(ENVS), default="workplace_assistant")
    parser.add_argument("--rollouts", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1, help="worker processes of the tool server")
    parser.add_argument("--kill", choices=["agent", "resources", "model", "none"], default="agent")
    parser.add_argument("--store", default=None, help="checkpoint store URL (default: a new local directory)")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object last")
    args = parser.parse_args(argv)
    if args.rollouts < 1 or args.workers < 1:
        print("error: --rollouts and --workers must be at least 1", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="nemo-gym-simple-agent-"))
    store = args.store or str(work / "store")
    started = time.monotonic()
    print(f"store {store}; servers log to {work}", flush=True)
    try:
        summary = run(args, work, store)
    except ImportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    summary |= {"store": store, "seconds": round(time.monotonic() - started, 1)}
    crash = f"killed the {summary['killed']} server" if summary["killed"] else "no crash (--kill none)"
    turns = sorted(summary["resumed_at_turns"].values())
    print(
        f"{summary['completed']}/{summary['rollouts']} rollouts completed; {crash}; "
        f"continued {summary['continued']} (resumed at turns {turns}), "
        f"fresh {summary['fresh_dispatch']}; repeated model calls {summary['repeated_model_calls']}, "
        f"tool calls {summary['repeated_tool_calls']}; matches the uninterrupted run: "
        f"{summary['matches_uninterrupted']}; checkpoint pause p50 {summary['pause_ms_p50']} ms"
    )
    for feature, reason in summary["not_demonstrated"].items():
        print(f"not demonstrated: {feature}: {reason}")
    for failure in summary["failures"]:
        print(f"FAILED: {failure}")
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
