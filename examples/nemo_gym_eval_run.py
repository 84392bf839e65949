"""A Gym evaluation as its users run it, checkpointed, through a crash, in one command.

    python examples/nemo_gym_eval_run.py [--env blackjack] [--rollouts N] [--seed S] [--store URL]
        [--kill resources|agent|model|collector|sigterm|none] [--json]

Starts the SDK launcher (``python -m rollout_checkpoint.integrations.nemo_gym.launcher``) on the
component root's shipped configs (the checkpointed blackjack, gymnasium agent and scripted model,
plus Gym's head server and its ``legacy_agent`` relay), then Gym's collection through
``rollout-checkpoint gym collect``. The scripted model's gate holds each game's second model call,
so the games are mid-episode when the collector checkpoints (SIGUSR1) and the crash comes:
``collector`` SIGKILLs the collector, ``sigterm`` preempts it (checkpoint, exit 75), a server
name SIGKILLs that server (the launcher restarts it alone, paused; the collector exits 75). The
same collect command then runs again, restores, and finishes; every row is compared with an
uninterrupted play (Gym's blackjack and the same policy, in this process). With ``--json`` the
last line is one object (the keys of ``nemo_gym_blackjack.py`` plus ``exit_75_seen``). Exit 0
only for a correct run. Needs NeMo Gym and Ray beside the SDK (see docs/nemo-gym.md).
"""

from __future__ import annotations

import argparse
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

_CLI = "import sys; from rollout_checkpoint.cli import main; sys.argv[0] = 'rollout-checkpoint'; main()"
_CONFIGS = (
    "+config_paths=[resources_servers/checkpointed/configs/blackjack.yaml,"
    "responses_api_models/checkpointed/configs/scripted.yaml]"
)
_RESOURCES = "blackjack_checkpointed"
_AGENT = "blackjack_checkpointed_agent"
_SERVERS = {"resources": _RESOURCES, "agent": _AGENT, "model": "policy_model"}
_MODEL = "++policy_model.responses_api_models.checkpointed"


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


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.wd = Path(tempfile.mkdtemp(prefix="rc-eval-", dir="/tmp"))  # short: Ray's socket paths
        self.store = args.store or str(self.wd / "store")
        self.token = self.wd / "token"
        self.token.write_text(secrets.token_hex(16))
        self.gate, self.held, self.calls = self.wd / "gate", self.wd / "held.jsonl", self.wd / "calls.jsonl"
        from rollout_checkpoint.integrations.nemo_gym import free_port

        self.head = free_port()
        self.seeds = {f"{args.env}{args.seed}-{i}": args.seed * 1000 + i for i in range(args.rollouts)}
        self.inp, self.out = self.wd / "in.jsonl", self.wd / "results" / "rollouts.jsonl"
        self.inp.write_text(
            "".join(
                json.dumps({"responses_create_params": {"input": "You are playing blackjack."}, "seed": s,
                            "_ng_rollout_id": r}) + "\n"
                for r, s in self.seeds.items()
            )
        )  # fmt: skip
        self.env = {
            k: v for k, v in os.environ.items() if not k.startswith(("ROLLOUT_CHECKPOINT_", "NEMO_GYM_"))
        }
        self.env.update({"RAY_TMPDIR": str(self.wd / "ray"), "TMPDIR": str(self.wd), "NO_PROXY": "127.0.0.1"})
        self.launcher: subprocess.Popen[bytes] | None = None

    def start_servers(self) -> None:
        args = [sys.executable, "-m", "rollout_checkpoint.integrations.nemo_gym.launcher", _CONFIGS,
                f"++head_server.port={self.head}", "++head_server.host=127.0.0.1",
                f"++{_RESOURCES}.resources_servers.checkpointed.checkpoint_class="
                "rollout_checkpoint.integrations.nemo_gym.seeded:SeededBlackjackEnv",
                "++observability_enabled=true", f"++model_call_capture_dir={self.wd / 'capture'}",
                f"{_MODEL}.hold_file={self.gate}", f"{_MODEL}.hold_log={self.held}",
                f"{_MODEL}.call_log={self.calls}", f"{_MODEL}.delay_s=0.05",
                "--workdir", str(self.wd / "servers"), "--store", self.store,
                "--token-file", str(self.token)]  # fmt: skip
        log = self.wd / "launcher.log"
        with log.open("wb") as out:
            self.launcher = subprocess.Popen(
                args, cwd=self.wd, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        _wait("the launcher serves", lambda: "serving " in log.read_text(errors="replace"), 300)

    def collect(self, name: str) -> tuple[subprocess.Popen[bytes], Path]:
        args = [f"+head_server.port={self.head}", "+head_server.host=127.0.0.1",
                f"+input_jsonl_fpath={self.inp}", f"+output_jsonl_fpath={self.out}", f"+agent_name={_AGENT}",
                f"+rollout_checkpoint.store={self.store}", f"+rollout_checkpoint.token_file={self.token}",
                "+rollout_checkpoint.checkpoint_every_s=600"]  # fmt: skip
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
        return int(state["servers"][_SERVERS[role]]["pid"])

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
    try:
        r.start_servers()
        r.gate.touch()
        proc, log = r.collect("collect")
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
            rerun, relog = r.collect("rerun")
            _wait("the re-run restores", lambda: "restored" in relog.read_text(errors="replace"), 300)
            r.gate.unlink(missing_ok=True)
            if rerun.wait(300) != 0:
                failures.append(f"the re-run exited {rerun.returncode}: {relog.read_text()[-1500:]}")
            restored_line = next((ln for ln in relog.read_text().splitlines() if "restored" in ln), "")
    finally:
        r.gate.unlink(missing_ok=True)
        r.stop()
    rows = {row["_ng_rollout_id"]: row for row in _lines(r.out)}
    reference = reference_run(0, r.seeds, 6)
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
                if s["attempt"] == row["_ng_attempt_index"] and s["turn"] <= resumed[rid]
            )
        if row["reward"] == ref["reward"] and _texts(row["response"]["output"]) == ref["texts"]:
            matches += 1
        else:
            failures.append(f"{rid} differs from the uninterrupted run")
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
    parser.add_argument("--env", choices=["blackjack"], default="blackjack")
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
