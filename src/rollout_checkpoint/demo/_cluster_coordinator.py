"""The multi-process demo's coordinator process (:func:`coordinator_main`).

It dispatches the rollouts to the agent server, hands finished ones off in its registry and
checkpoints every ``checkpoint_every`` seconds. The demo's parent acts as the process supervisor:
it announces each kill in a control file (``killed`` += 1) *before* it sends SIGKILL, and again
once the replacement answers (``restarted`` += 1). While a kill is announced the coordinator
starts no checkpoint and takes failures (a refused model call, an unreachable server, a failed
checkpoint) as that crash's symptoms. Once every announced kill is restarted it recovers:

1. abort the checkpoint a participant still holds open (resume it);
2. retire the attempts still live in the survivors (their running loops stop at the fence);
3. restore the latest published checkpoint of this run into survivors and replacement, resume,
   dispatch the rest (continued rollouts as attempt N+1 from their boundary, fresh ones from
   their input), and checkpoint at once.

A restore installs attempt N+1 of a checkpoint that holds attempt N; a participant that already
took (or fenced) N+1 refuses it. So between a restore and the next published checkpoint, a crash
cannot be recovered into the survivors: the coordinator then exits with :data:`FRESH_EXIT` and the
parent restarts every server (and never otherwise). A restarted coordinator reads the attempts
its predecessor dispatched from the state file, which is written before each dispatch.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import httpx
from pydantic import JsonValue

from ..coordinator import Coordinator, RestoreFailedError
from ..errors import CheckpointError
from ..format.commit_log import list_published
from ..ids import ExecutionId
from ..participants.environments import reference_environments
from ..reader import load_checkpoint
from ..registry import LiveExecutionRegistry
from ..server import TOKEN_ENV, RemoteParticipant, RemoteTokenStore, exit_with_env
from ..store import ObjectStore, open_store
from ._demonstrated import continuable_cuts

__all__ = ["FRESH_EXIT", "REFUSED_EXIT", "coordinator_main", "read_json", "write_json"]

FRESH_EXIT = 3
"""Exit status asking the parent to restart every server (the survivors cannot take the restore)."""
REFUSED_EXIT = 2
"""Exit status of a refused restore (the negative control)."""
MAX_TOKENS = 12
MAX_FAILED_CHECKPOINTS = 3
"""Aborted checkpoints in a row (none announced as a crash's symptom) that end the run."""
_RESTART_WAIT_S = 180.0


def write_json(path: Path, value: Any) -> None:
    """Replace ``path`` atomically (a reader sees the old or the new document, never half)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _latest_of_run(store: ObjectStore, rollout_ids: set[str]) -> str | None:
    """The newest published checkpoint of this run (an earlier run may share the store)."""
    for published in list_published(store):  # newest first
        if published.record is None:
            continue
        plan = load_checkpoint(store, published.checkpoint_id, verify=False)  # identity only
        if set(plan.rollouts) <= rollout_ids:
            return published.checkpoint_id
    return None


class _Failed(Exception):
    """A rollout attempt the agent reports failed (or does not know)."""


class _CoordinatorProcess:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        token = os.environ[TOKEN_ENV]
        self.store = open_store(config["store"], **_store_options(config))
        urls: dict[str, str] = config["urls"]
        # the coordinator never reads the execution lists of a commit reply: brief replies
        self.remotes = [
            RemoteParticipant(urls[name], token=token, brief_commits=True) for name in config["participants"]
        ]
        self.tokens = RemoteTokenStore(urls["tokens"], token=token)
        self.registry = LiveExecutionRegistry()
        self.coordinator = self._coordinator(self.remotes)
        self.specs: dict[str, dict[str, Any]] = {s["rollout_id"]: s for s in config["specs"]}
        self.modes = {env.name: env.mode for env in reference_environments()}
        self.agent = httpx.Client(base_url=urls["agent"], timeout=120, trust_env=False)
        self.state_path = Path(config["state"])
        self.control_path = Path(config["control"])
        self.state = read_json(self.state_path) or {
            "results": {},
            "pauses_ms": [],
            "checkpoints": [],
            "restores": [],
            "running": {},
            "handled": 0,
        }
        self.running = {r: ExecutionId(rollout_id=r, attempt=a) for r, a in self.state["running"].items()}
        self.every = float(config["checkpoint_every"])
        self.next_checkpoint = time.monotonic() + self.every
        self.failed_in_a_row = 0

    def _coordinator(self, remotes: list[RemoteParticipant]) -> Coordinator:
        return Coordinator(
            self.store,
            remotes,
            self.registry,
            self.tokens,
            accept_unsafe_store=bool(self.config.get("accept_unsafe_store")),
            # a replacement coordinator process is the same run: it takes the next epoch, which
            # fences the one it replaces; the demo takes its store over explicitly
            run_id=str(self.config.get("run_id") or "demo"),
            takeover=True,
        )

    # -- state and the supervisor's announcements ---------------------------------------------------
    def save(self) -> None:
        self.state["running"] = {r: e.attempt for r, e in self.running.items()}
        write_json(self.state_path, self.state)

    def fresh(self, reason: str) -> int:
        """Ask the parent to restart every server (not an error of the run)."""
        self.state.setdefault("full_restart_reasons", []).append(reason)
        self.save()
        return FRESH_EXIT

    def error(self, message: str) -> None:
        self.state.setdefault("errors", []).append(message)
        self.save()

    def control(self) -> tuple[int, int]:
        value = read_json(self.control_path)
        return int(value.get("killed", 0)), int(value.get("restarted", 0))

    def pending(self) -> bool:
        """A kill is announced that this coordinator has not recovered from yet."""
        return self.control()[0] > int(self.state["handled"])

    # -- dispatch -------------------------------------------------------------------------------------
    def dispatch(self, execution: ExecutionId) -> None:
        spec = self.specs[execution.rollout_id]
        self.running[execution.rollout_id] = execution
        self.save()  # before the request: a successor must know which attempt may be live
        response = self.agent.post(
            f"/ng-rollout/{execution.rollout_id}/run",
            json={
                "attempt": execution.attempt,
                "env": spec["env"],
                "seed": spec["seed"],
                "turns": spec["turns"],
                "max_tokens": MAX_TOKENS,
                "restart_only": self.modes[spec["env"]] == "restart_only",
            },
        )
        if response.status_code >= 300:
            raise CheckpointError(f"{execution}: the agent refused the run: {response.text}")

    def dispatch_all(self) -> None:
        for rollout_id, spec in self.specs.items():
            execution = self.registry.dispatch(
                rollout_id,
                input_digest=spec["digest"],
                restart_only=self.modes[spec["env"]] == "restart_only",
            )
            self.registry.start(execution)
            self.dispatch(execution)

    def poll(self) -> None:
        for rollout_id, execution in list(self.running.items()):
            result = self.agent.get(
                f"/ng-rollout/{rollout_id}/result", params={"attempt": execution.attempt}
            ).json()
            if result.get("status") == "done":
                outcome: dict[str, JsonValue] = {
                    "summary": result["summary"],
                    "reward": result["reward"],
                    "cuts_continued": result.get("cuts_continued", 0),
                    "restored_turn": result.get("restored_turn"),
                    "first_turn": result.get("first_turn"),
                }
                self.registry.finish(execution)
                self.registry.hand_off(execution, outcome, reward=float(result["reward"]))
                self.state["results"][rollout_id] = outcome
                del self.running[rollout_id]
            elif result.get("status") in ("failed", "unknown"):
                raise _Failed(f"{execution}: {result.get('error', result)}")

    def checkpoint(self) -> None:
        outcome = self.coordinator.checkpoint(deadline_s=120)
        self.state["pauses_ms"].append(outcome.pause_seconds * 1000)
        self.state["checkpoints"].append(outcome.checkpoint_id)
        self.state["restoring"] = False  # the survivors' attempts are now in a published checkpoint
        plan = load_checkpoint(self.store, outcome.checkpoint_id, verify=False)  # a report
        self.state["continuable"] = int(plan.counts().get("continue", 0))
        self.state["continuable_cuts"] = continuable_cuts(plan)
        self.next_checkpoint = time.monotonic() + self.every

    def try_checkpoint(self) -> None:
        """Checkpoint; one that fails before its commit point was aborted (nothing published,
        every participant resumed), so the run goes on and the next interval tries again. Only
        :data:`MAX_FAILED_CHECKPOINTS` failures in a row end the run, naming the last one."""
        try:
            self.checkpoint()
        except CheckpointError as exc:
            if self.pending():
                raise  # a symptom of the announced crash: recovery follows
            failures = self.state.setdefault("checkpoint_failures", [])
            failures.append(f"{type(exc).__name__} ({exc.code}): {exc}")
            self.failed_in_a_row += 1
            self.next_checkpoint = time.monotonic() + self.every
            if self.failed_in_a_row >= MAX_FAILED_CHECKPOINTS:
                raise CheckpointError(
                    f"{self.failed_in_a_row} checkpoints in a row failed; the last: {failures[-1]}"
                ) from exc
            return
        self.failed_in_a_row = 0

    # -- recovery ---------------------------------------------------------------------------------------
    def wait_restarted(self) -> int:
        """Wait until every announced kill has its replacement running; the announced count."""
        end = time.monotonic() + _RESTART_WAIT_S
        while True:
            killed, restarted = self.control()
            if restarted >= killed:
                return killed
            if time.monotonic() > end:
                raise CheckpointError(f"no replacement answered {_RESTART_WAIT_S:.0f} s after the kill")
            time.sleep(0.05)

    def recover(self) -> int | None:
        """Restore the latest checkpoint into survivors and replacements; an exit status if the
        run cannot go on here (a refused restore, or survivors that need replacing)."""
        announced = self.wait_restarted()
        if self.state.get("restoring"):
            return self.fresh("a crash interrupted a restore before its next checkpoint")
        latest = _latest_of_run(self.store, set(self.specs))
        if latest is None:
            self.error("no checkpoint of this run was published before the crash")
            return 1
        retired = list(self.running.values())  # survivors drop them; their loops stop
        coordinator = self.coordinator
        skip = self.config.get("skip")
        if skip:  # the negative control: restore without one kind, which must be refused
            self.coordinator.retire(retired, deadline_s=60)
            coordinator = self._coordinator([r for r in self.remotes if r.capabilities().kind != skip])
        self.state["restoring"] = True
        self.save()
        try:
            # abort what the crash left open, retire, restore into survivors and replacements, resume
            restored = coordinator.recover(retired, checkpoint_id=latest, deadline_s=120)
        except RestoreFailedError:
            raise  # rolled back (a participant failed, say a new crash): survivors are now ahead
        except CheckpointError as exc:  # refused before anything was touched
            self.state["restore_refused"] = exc.code
            self.error(f"restore refused ({exc.code}): {exc.message}")
            return REFUSED_EXIT
        plan = restored.plan
        self.state["restores"].append(
            {
                "checkpoint_id": plan.checkpoint_id,
                "restore_id": restored.restore_id,
                "retired": len(retired),
                **plan.counts(),
                "fresh_reasons": sorted({p.reason for p in plan.fresh}),
            }
        )
        self.running.clear()
        for rollout_id, entry in plan.rollouts.items():
            if entry.disposition == "completed":
                info = self.registry.get(rollout_id)
                if info.result is not None:
                    self.state["results"][rollout_id] = info.result.result
                continue
            nxt = entry.execution.next_attempt()
            if entry.disposition == "fresh_dispatch":
                self.registry.start(nxt)
            self.dispatch(nxt)
        self.state["handled"] = announced
        self.save()
        self.next_checkpoint = time.monotonic()  # narrows the window in which survivors are ahead
        return None

    def recover_until_done(self) -> int | None:
        """Recover; a failure explained by a newer announced kill waits for it and retries."""
        while True:
            announced = self.control()[0]
            try:
                return self.recover()
            except (CheckpointError, httpx.HTTPError) as exc:
                if self.state.get("restoring"):
                    return self.fresh(f"the restore failed: {exc}")
                if self.control()[0] == announced:
                    time.sleep(1.0)  # the kill may be announced just after its symptom showed
                    if self.control()[0] == announced:
                        self.error(f"recovery failed: {type(exc).__name__}: {exc}")
                        return 1

    # -- the run ----------------------------------------------------------------------------------------
    def run(self) -> int:
        if self.config.get("fresh"):  # every server is new: nobody can be ahead of a checkpoint
            self.state["restoring"] = False
        need_recovery = bool(self.config.get("restore"))
        if not need_recovery:
            self.dispatch_all()
        self.save()
        while need_recovery or self.running:
            if need_recovery or self.pending():
                killed, restarted = self.control()
                if restarted < killed:  # the replacement is not up yet
                    time.sleep(0.05)
                    continue
                status = self.recover_until_done()
                if status is not None:
                    return status
                need_recovery = False
                continue
            try:
                self.poll()
                if self.running and time.monotonic() >= self.next_checkpoint:
                    self.try_checkpoint()
            except (CheckpointError, httpx.HTTPError, ValueError, _Failed) as exc:
                if self.pending():
                    continue  # a symptom of the announced crash: recovery follows
                self.error(f"{type(exc).__name__}: {exc}")
                return 1
            self.save()
            time.sleep(0.05)
        self.state["done"] = True
        self.save()
        return 0


def _store_options(config: dict[str, Any]) -> dict[str, Any]:
    return {"accept_unsafe_store": True} if config.get("accept_unsafe_store") else {}


def coordinator_main(config_path: str) -> int:
    """The coordinator process: dispatch (or recover), hand off, checkpoint periodically; exit 0
    once every rollout handed off a result (see the module docstring for the other statuses)."""
    exit_with_env()  # the demo that started it: a SIGKILLed demo leaves nothing running
    config = json.loads(Path(config_path).read_text())
    return _CoordinatorProcess(config).run()
