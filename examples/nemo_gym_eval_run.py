"""A Gym evaluation as its users run it, checkpointed, through a crash, in one command.

    python examples/nemo_gym_eval_run.py [--env blackjack|workplace_assistant] [--rollouts N] [--seed S]
        [--store URL] [--kill resources|agent|model|collector|sigterm|none] [--json]

Starts the SDK launcher (``python -m rollout_checkpoint.integrations.nemo_gym.launcher``) on the
component root's shipped configs, plus Gym's head server and its ``legacy_agent`` relay:

* ``blackjack``: the checkpointed blackjack, gymnasium agent and scripted model
  (``blackjack.yaml`` + ``scripted.yaml``);
* ``workplace_assistant``: Gym's ``simple_agent`` checkpointed (``CheckpointedSimpleAgent``), Gym's
  ``workplace_assistant`` tool server with its built-in spec, and Gym's ``openai_model`` checkpointed
  (``CheckpointedOpenAIModel``) over the SDK's deterministic backend, started in this process
  (``workplace_assistant.yaml`` + ``openai_model.yaml``; the task rows Gym ships with it).

Then Gym's collection through ``rollout-checkpoint gym collect``. The model's gate holds each
rollout's second model call, so the rollouts are mid-episode when the collector checkpoints
(SIGUSR1) and the crash comes: ``collector`` SIGKILLs the collector, ``sigterm`` preempts it
(checkpoint, exit 75), a server name SIGKILLs that server (the launcher restarts it alone, paused;
the collector exits 75). The same collect command then runs again, restores, and finishes; every
row is compared with an uninterrupted play (blackjack: Gym's blackjack and the same policy, in
this process; workplace_assistant: an uninterrupted collection of the same rows through the same
servers, compared by tool calls, tool outputs, answers and reward). With ``--json`` the last line
is one object (the keys of ``nemo_gym_blackjack.py`` plus ``exit_75_seen``). Exit 0 only for a
correct run. Needs NeMo Gym and Ray beside the SDK (see docs/nemo-gym.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# the episode summary the simple-agent example compares with (this folder is on sys.path when a
# script in it runs)
from nemo_gym_simple_agent import episode

_CLI = "import sys; from rollout_checkpoint.cli import main; sys.argv[0] = 'rollout-checkpoint'; main()"
_MODEL = "++policy_model.responses_api_models.checkpointed"
# --env: the component root's shipped configs, the servers' names, the task rows
ENVS: dict[str, dict[str, Any]] = {
    "blackjack": {
        "configs": ["resources_servers/checkpointed/configs/blackjack.yaml",
                    "responses_api_models/checkpointed/configs/scripted.yaml"],
        "resources": "blackjack_checkpointed",
        "overrides": ["++blackjack_checkpointed.resources_servers.checkpointed.checkpoint_class="
                      "rollout_checkpoint.integrations.nemo_gym.seeded:SeededBlackjackEnv",
                      f"{_MODEL}.delay_s=0.05"],
    },
    "workplace_assistant": {
        "configs": ["resources_servers/checkpointed/configs/workplace_assistant.yaml",
                    "responses_api_models/checkpointed/configs/openai_model.yaml"],
        "resources": "workplace_assistant_checkpointed",
        "overrides": [],
        "tool_turns": 3,  # the backend's tool-calling model turns before its answer
    },
    "example_session_state_mgmt": {  # its /verify leaves the session open
        "configs": ["resources_servers/checkpointed/configs/example_session_state_mgmt.yaml",
                    "responses_api_models/checkpointed/configs/openai_model.yaml"],
        "resources": "counter_checkpointed",
        "overrides": [],
        "tool_turns": 3,
    },
}  # fmt: skip
_INT = {"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"],
        "additionalProperties": False}  # fmt: skip
_COUNTER_TOOLS = [
    {"type": "function", "name": "increment_counter", "strict": True, "parameters": _INT},
    {"type": "function", "name": "get_counter_value", "strict": True,
     "parameters": {"type": "object", "properties": {}, "required": [], "additionalProperties": False}},
]  # fmt: skip


def _wait(what: str, done: Any, timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > end:
            raise RuntimeError(f"not within {timeout_s:.0f} s: {what}")
        time.sleep(0.1)


def _lines(path: Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def _task_row(env: str, seed: int) -> dict[str, Any]:
    """A task row: blackjack's deal is seeded; the counter starts at the seed; workplace_assistant
    takes the task rows Gym ships with it (row ``seed`` modulo their number)."""
    if env == "blackjack":
        return {"responses_create_params": {"input": "You are playing blackjack."}, "seed": seed}
    if env == "example_session_state_mgmt":
        text = f"Start at {seed}, add twice, then read the counter."
        params = {"input": [{"role": "user", "content": text}], "tools": _COUNTER_TOOLS}
        return {"responses_create_params": params, "initial_count": seed, "expected_count": seed + 3}
    import importlib

    module = importlib.import_module(f"resources_servers.{env}.app")
    rows = (Path(str(module.__file__)).parent / "data" / "example.jsonl").read_text().splitlines()
    return dict(json.loads(rows[seed % len(rows)]))


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.wd = Path(tempfile.mkdtemp(prefix="rc-eval-", dir="/tmp"))  # short: Ray's socket paths
        self.store = args.store or str(self.wd / "store")
        self.token = self.wd / "token"
        self.token.write_text(secrets.token_hex(16))
        self.gate, self.held, self.calls = self.wd / "gate", self.wd / "held.jsonl", self.wd / "calls.jsonl"
        from rollout_checkpoint.integrations.nemo_gym import free_port

        self.head = free_port()
        self.spec = ENVS[args.env]
        self.resources = self.spec["resources"]
        self.agent = f"{self.resources}_agent"
        self.servers = {"resources": self.resources, "agent": self.agent, "model": "policy_model"}
        prefix = args.env.split("_")[0]
        self.seeds = {f"{prefix}{args.seed}-{i}": args.seed * 1000 + i for i in range(args.rollouts)}
        self.inp, self.out = self.wd / "in.jsonl", self.wd / "results" / "rollouts.jsonl"
        self.rows = {r: {**_task_row(args.env, s), "_ng_rollout_id": r} for r, s in self.seeds.items()}
        self.inp.write_text("".join(json.dumps(row) + "\n" for row in self.rows.values()))
        self.backend_url = ""
        # the uninterrupted collection runs first, as another run on the store
        self.takeover = ["+rollout_checkpoint.takeover=true"] if "tool_turns" in self.spec else []
        self.env = {
            k: v for k, v in os.environ.items() if not k.startswith(("ROLLOUT_CHECKPOINT_", "NEMO_GYM_"))
        }
        self.env.update({"RAY_TMPDIR": str(self.wd / "ray"), "TMPDIR": str(self.wd), "NO_PROXY": "127.0.0.1"})
        self.launcher: subprocess.Popen[bytes] | None = None

    def start_servers(self) -> None:
        configs = f"+config_paths=[{','.join(self.spec['configs'])}]"
        backend = [f"{_MODEL}.openai_base_url={self.backend_url}"] if self.backend_url else []
        args = [sys.executable, "-m", "rollout_checkpoint.integrations.nemo_gym.launcher", configs,
                f"++head_server.port={self.head}", "++head_server.host=127.0.0.1", *self.spec["overrides"],
                *backend, "++observability_enabled=true", f"++model_call_capture_dir={self.wd / 'capture'}",
                f"{_MODEL}.hold_file={self.gate}", f"{_MODEL}.hold_log={self.held}",
                f"{_MODEL}.call_log={self.calls}",
                "--workdir", str(self.wd / "servers"), "--store", self.store,
                "--token-file", str(self.token)]  # fmt: skip
        log = self.wd / "launcher.log"
        with log.open("wb") as out:
            self.launcher = subprocess.Popen(
                args, cwd=self.wd, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        _wait("the launcher serves", lambda: "serving " in log.read_text(errors="replace"), 300)

    def collect(self, name: str, inp: Path | None = None, out: Path | None = None,
                *extra: str) -> tuple[subprocess.Popen[bytes], Path]:  # fmt: skip
        args = [f"+head_server.port={self.head}", "+head_server.host=127.0.0.1",
                f"+input_jsonl_fpath={inp or self.inp}", f"+output_jsonl_fpath={out or self.out}",
                f"+agent_name={self.agent}", f"+rollout_checkpoint.store={self.store}",
                f"+rollout_checkpoint.token_file={self.token}", "+rollout_checkpoint.checkpoint_every_s=600",
                *extra]  # fmt: skip
        log = self.wd / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen([sys.executable, "-c", _CLI, "gym", "collect", *args], cwd=self.wd,
                                    env=self.env, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
        return proc, log

    def mid_episode(self) -> bool:
        held = {c["rollout_id"] for c in _lines(self.held)}
        written = {r.get("_ng_rollout_id") for r in _lines(self.out)}
        return set(self.seeds) <= held | written

    def server_pid(self, role: str) -> int:
        state = json.loads((self.wd / "servers" / "launcher.json").read_text())
        return int(state["servers"][self.servers[role]]["pid"])

    def reference_collection(self, failures: list[str]) -> dict[str, Any]:
        """The uninterrupted collection: the same rows (rollout ids ``ref-<id>``) through the same
        servers into another output (another run on the store: the checkpointed run then takes
        it over, and restores over the finished sessions it leaves at the tool server)."""
        inp, out = self.wd / "ref-in.jsonl", self.wd / "reference" / "rollouts.jsonl"
        inp.write_text("".join(json.dumps({**row, "_ng_rollout_id": f"ref-{r}"}) + "\n"
                               for r, row in self.rows.items()))  # fmt: skip
        proc, log = self.collect("reference", inp, out, "+rollout_checkpoint.takeover=true")
        if proc.wait(300) != 0:
            failures.append(
                f"the uninterrupted collection exited {proc.returncode}: {log.read_text()[-1500:]}"
            )
        rows = {str(row["_ng_rollout_id"])[4:]: row for row in _lines(out)}
        return {rid: episode(row) for rid, row in rows.items()}

    def stop(self) -> None:
        if self.launcher is not None and self.launcher.poll() is None:
            self.launcher.send_signal(signal.SIGTERM)
            try:
                self.launcher.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.launcher.pid, signal.SIGKILL)
                self.launcher.wait(10)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from rollout_checkpoint.integrations.nemo_gym import reference_run
    from rollout_checkpoint.integrations.nemo_gym.scenario import _texts

    r = Run(args)
    failures: list[str] = []
    kill = None if args.kill == "none" else args.kill
    exit_75 = killed = False
    restored_line = ""
    reference: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        if "tool_turns" in r.spec:  # Gym's openai_model over the SDK's deterministic backend
            from rollout_checkpoint.integrations.nemo_gym import start_backend

            r.backend_url = stack.enter_context(
                start_backend(args.seed, tool_turns=r.spec["tool_turns"])
            ).base_url
        try:
            r.start_servers()
            if "tool_turns" in r.spec:  # first, so the run below restores over its finished sessions
                reference = r.reference_collection(failures)
            r.gate.touch()
            proc, log = r.collect("collect", None, None, *r.takeover)
            _wait("every game mid-episode or written", r.mid_episode, 180)
            proc.send_signal(signal.SIGUSR1)
            _wait("the SIGUSR1 checkpoint", lambda: "(sigusr1;" in log.read_text(errors="replace"), 120)
            if kill is None:
                r.gate.unlink()
            elif kill == "collector":
                proc.kill()
            elif kill == "sigterm":
                proc.send_signal(signal.SIGTERM)
            else:
                os.kill(r.server_pid(kill), signal.SIGKILL)
            code = proc.wait(300)
            killed = kill is not None
            exit_75 = code == 75
            if kill in ("sigterm", "resources", "agent", "model") and not exit_75:
                failures.append(f"the collector exited {code}, not 75: {log.read_text()[-1500:]}")
            if kill is None and code != 0:
                failures.append(f"the collection exited {code}: {log.read_text()[-1500:]}")
            if killed:
                rerun, relog = r.collect("rerun", None, None, *r.takeover)
                _wait(
                    "the re-run restores",
                    lambda: "restored" in relog.read_text(errors="replace") or rerun.poll() is not None,
                    300,
                )
                r.gate.unlink(missing_ok=True)
                if rerun.wait(300) != 0:
                    failures.append(f"the re-run exited {rerun.returncode}: {relog.read_text()[-1500:]}")
                restored_line = next((ln for ln in relog.read_text().splitlines() if "restored" in ln), "")
        finally:
            r.gate.unlink(missing_ok=True)
            r.stop()
    rows = {row["_ng_rollout_id"]: row for row in _lines(r.out)}
    if args.env == "blackjack":
        reference = {
            rid: {"reward": ref["reward"], "texts": ref["texts"]}
            for rid, ref in reference_run(0, r.seeds, 6).items()
        }
    matches = 0
    resumed: dict[str, int] = {}
    repeated_tools = 0
    for rid, ref in reference.items():
        row = rows.get(rid)
        if row is None:
            continue
        meta = row.get("rollout_checkpoint") or {}
        if meta.get("restored_turn") is not None:
            resumed[rid] = int(meta["restored_turn"])
            repeated_tools += sum(
                1
                for s in meta.get("steps", [])
                if s["attempt"] == row["_ng_attempt_index"]
                and s.get("turn", s.get("step", 0)) <= resumed[rid]
            )
        seen = (
            {"reward": row["reward"], "texts": _texts(row["response"]["output"])}
            if "texts" in ref
            else episode(row)
        )
        if seen == ref:
            matches += 1
        else:
            failures.append(f"{rid} differs from the uninterrupted run")
    if set(reference) != set(r.seeds):
        failures.append(f"the uninterrupted run has {len(reference)} of {len(r.seeds)} rollouts")
    calls = [(c["rollout_id"], c["attempt"], c["call_id"]) for c in _lines(r.calls)]
    repeated_models = len(calls) - len(set(calls))
    lost = len(r.seeds) - len(rows)
    if lost:
        failures.append(f"{lost} rollouts have no row")
    if repeated_models or repeated_tools:
        failures.append(f"repeated model calls {repeated_models}, tool calls {repeated_tools}")
    counts: dict[str, int] = {}
    if restored_line:
        for key in ("completed", "continue", "fresh_dispatch"):
            part = restored_line.split(f"'{key}': ", 1)
            counts[key] = int(part[1].split(",")[0].split("}")[0]) if len(part) == 2 else 0
    shown = {"crash": killed, "rollouts_continued": bool(counts.get("continue")), "resumed_mid_episode": any(
        t >= 1 for t in resumed.values())}  # fmt: skip
    why = {
        k: ("no crash was asked for (--kill none)" if not killed else "not seen in this run")
        for k, v in shown.items()
        if not v
    }
    return {
        "ok": not failures,
        "failures": failures,
        "demonstrated": shown,
        "not_demonstrated": why,
        "rollouts": len(r.seeds),
        "completed": len(rows),
        "continued": counts.get("continue", 0),
        "resumed_at_turns": resumed,
        "fresh_dispatch": counts.get("fresh_dispatch", 0),
        "repeated_model_calls": repeated_models,
        "repeated_tool_calls": repeated_tools,
        "lost_results": lost,
        "matches_uninterrupted": matches == len(reference),
        "pause_ms_p50": None,
        "killed": kill,
        "stale_attempt_status": None,
        "checkpoint_timings_ms": [],
        "exit_75_seen": exit_75,
        "store": r.store,
        "workdir": str(r.wd),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", choices=sorted(ENVS), default="blackjack")
    parser.add_argument("--rollouts", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--store", default=None, help="checkpoint store URL (default: a new local directory)")
    parser.add_argument(
        "--kill", choices=["resources", "agent", "model", "collector", "sigterm", "none"], default="sigterm"
    )
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object last")
    args = parser.parse_args(argv)
    if args.rollouts < 1:
        print("error: --rollouts must be at least 1", file=sys.stderr)
        return 1
    started = time.monotonic()
    try:
        summary = run(args)
    except Exception as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    summary["seconds"] = round(time.monotonic() - started, 1)
    print(
        f"{summary['completed']}/{summary['rollouts']} rollouts; killed {summary['killed']}; exit 75 seen: "
        f"{summary['exit_75_seen']}; continued {summary['continued']} "
        f"(turns {sorted(summary['resumed_at_turns'].values())}); "
        f"matches the uninterrupted run: {summary['matches_uninterrupted']}"
    )
    for failure in summary["failures"]:
        print(f"FAILED: {failure}")
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
