"""Checkpoint pause with generations in flight: cut at a durable prefix vs drain to completion.

    python benchmarks/generation_cuts.py [--calls 16] [--max-tokens 400] [--token-delay 0.005] \\
        [--runs 3] [--json]

``--calls`` rollouts each wait on one policy call (their agent parked on it) when a checkpoint
starts; every generation has ``--max-tokens`` tokens at ``--token-delay`` s per token on the fake
backend, and the checkpoint starts once each has produced a quarter of them. Two modes, same
deployment (agent + policy model + registry + reference token store on local disk):

* **cut** - ``PolicyModelParticipant.generate``: prepare cuts every generation (buffer swap,
  frozen prefix staged durably) and holds the responses until resume;
* **drain** (the baseline) - the same generations behind the external ``ModelCall`` API, which
  blocks prepare until each call is staged, i.e. until every generation has finished.

The figure is the coordinator's pause (first prepare to last resume), median over ``--runs``,
and the ratio cut / drain of the same run. With ``--json`` the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_info, median
from rollout_checkpoint import (
    AgentBoundaryRecord,
    AgentParticipant,
    Coordinator,
    FakeGenerationBackend,
    LiveExecutionRegistry,
    ObjectStoreTokenStore,
    PolicyModelParticipant,
)
from rollout_checkpoint.ids import ExecutionId
from rollout_checkpoint.store import LocalStore

PROMPT = [1, 2, 3, 4]


def run_one(mode: str, calls: int, max_tokens: int, delay: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="cuts-bench-") as root:
        store = LocalStore(root)
        tokens = ObjectStoreTokenStore(store)
        backend = FakeGenerationBackend(seed=1, token_delay=delay, concurrency=calls, token_source=tokens)
        agent = AgentParticipant("agent-0")
        model = PolicyModelParticipant(tokens, "policy-0", backend=backend)
        registry = LiveExecutionRegistry()
        coordinator = Coordinator(store, [agent, model], registry, tokens)
        threads = []
        for i in range(calls):
            execution = registry.dispatch(f"r{i}", input_digest=f"r{i}")
            registry.start(execution)
            agent.begin(execution)
            agent.boundary(
                execution,
                AgentBoundaryRecord(rollout_id=f"r{i}", attempt=0, boundary_index=1, turn_index=1),
            )
            agent.start_turn(execution)
            thread = threading.Thread(target=_call, args=(mode, agent, model, backend, execution, max_tokens))
            thread.start()
            threads.append(thread)
        while backend.stats()["tokens_generated"] < calls * max_tokens // 4:
            time.sleep(0.001)
        outcome = coordinator.checkpoint(deadline_s=600)
        for thread in threads:
            thread.join(600)
        stats = model.stats()
        agent.close()
        model.close()
        return {
            "pause_s": outcome.pause_seconds,
            "cuts": stats["cuts"],
            "tokens_at_checkpoint_start": calls * max_tokens // 4,
        }


def _call(
    mode: str,
    agent: AgentParticipant,
    model: PolicyModelParticipant,
    backend: FakeGenerationBackend,
    execution: ExecutionId,
    max_tokens: int,
) -> None:
    with agent.awaiting_model(execution, "c1"):
        if mode == "cut":
            model.generate(execution, "c1", PROMPT, max_tokens=max_tokens)
        else:
            with model.call(execution, "c1") as call:  # drain: blocks prepare until staged
                generation = backend.open((execution.rollout_id, 0, "c1"), PROMPT, max_tokens)
                with backend.slot():
                    out = generation.run()
                call.stage(
                    prompt_token_ids=PROMPT,
                    generation_token_ids=out.token_ids,
                    generation_log_probs=out.log_probs,
                )
    agent.boundary(  # the turn ends with the call's result
        execution,
        AgentBoundaryRecord(
            rollout_id=execution.rollout_id,
            attempt=0,
            boundary_index=2,
            turn_index=2,
            last_model_call_id="c1",
        ),
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--token-delay", type=float, default=0.005)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {"cut": [], "drain": []}
    for _ in range(args.runs):
        for mode in ("cut", "drain"):
            results[mode].append(run_one(mode, args.calls, args.max_tokens, args.token_delay))
    cut = median([r["pause_s"] for r in results["cut"]])
    drain = median([r["pause_s"] for r in results["drain"]])
    summary: dict[str, Any] = {
        "calls": args.calls,
        "max_tokens": args.max_tokens,
        "token_delay_s": args.token_delay,
        "runs": args.runs,
        "generation_s": args.max_tokens * args.token_delay,
        "pause_cut_s": round(cut, 4),
        "pause_drain_s": round(drain, 4),
        "ratio_cut_over_drain": round(cut / drain, 4),
        "cuts_per_run": [r["cuts"] for r in results["cut"]],
        "machine": machine_info(),
    }
    if not args.json:
        print(
            f"{args.calls} generations of {args.max_tokens} tokens x {args.token_delay}s, checkpoint at 1/4: "
            f"pause cut {cut:.3f}s vs drain {drain:.3f}s (x{cut / drain:.3f}), medians of {args.runs}",
            file=sys.stderr,
        )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
