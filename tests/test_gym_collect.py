"""``rollout-checkpoint gym collect`` (Gym's ``ng_collect_rollouts``, checkpointed) as a real
process against real Gym servers (the checkpointed blackjack deployment plus Gym's head server
and ``legacy_agent`` relay): checkpoints on its timer, on SIGUSR1 (and goes on) and on SIGTERM
(exit 75); SIGKILLed or preempted, the same command again resumes from the last checkpoint and
the output equals an uninterrupted run's (Gym's blackjack and the same scripted policy, played
in this process), and Gym's own aggregation runs on it.

The scripted model's gate holds each game's second model call, so a signal always finds games
mid-episode; every wait is on a condition, bounded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from _gym import require_gym
from _procs import kill_mentioning

require_gym()

from _gym_collect import CollectDeployment, CollectServers, collect_args, read_rows, write_input  # noqa: E402
from rollout_checkpoint.format.commit_log import list_published  # noqa: E402
from rollout_checkpoint.integrations.nemo_gym.collect import CollectSettings  # noqa: E402
from rollout_checkpoint.integrations.nemo_gym.scenario import _texts, reference_run  # noqa: E402
from rollout_checkpoint.reader import load_checkpoint  # noqa: E402
from rollout_checkpoint.store import open_store  # noqa: E402

# one deployment for the module: its tests stay in one xdist worker
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("gym_collect")]
DRIVER = "rollout_checkpoint.integrations.nemo_gym.collect:collect"
ROLLOUTS = 6
_CLI = "import sys; from rollout_checkpoint.cli import main; sys.argv[0] = 'rollout-checkpoint'; main()"
# what `gym eval run` / ng_e2e_collect_rollouts does with +rollout_collection_driver (after starting
# the servers): build the collection config, import module:function, await it with the resolved config
_DRIVER = """
import asyncio, importlib, sys
from nemo_gym.global_config import get_global_config_dict
from nemo_gym.rollout_collection import RolloutCollectionConfig
from omegaconf import OmegaConf
sys.argv = ["gym", *sys.argv[1:]]
g = get_global_config_dict()
config = RolloutCollectionConfig.model_validate(OmegaConf.to_container(g))
module, _, name = g.rollout_collection_driver.partition(":")
asyncio.run(getattr(importlib.import_module(module), name)(config, OmegaConf.to_container(g, resolve=True)))
"""
_GYM = "import sys; from nemo_gym.cli.legacy import main; sys.argv[0] = '{name}'; sys.exit(main())"


@pytest.fixture(scope="module")
def dep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CollectDeployment]:
    """One deployment for the module: each test's rows have their own rollout ids and run id."""
    root = tmp_path_factory.mktemp("gym-collect")
    deployment = CollectDeployment(
        CollectServers(store=str(root / "store"), workdir=root / "servers", model_delay_s=0.05)
    )
    try:
        deployment.start_all()
        yield deployment
    finally:
        deployment.stop()
        left = kill_mentioning(str(root))  # every process has TMPDIR under root
        assert left == [], f"processes left running: {left}"


@pytest.fixture
def run(dep: CollectDeployment, tmp_path: Path) -> Iterator[Path]:
    """This test's folder; the model's gate is closed while it runs."""
    dep.hold_model()
    try:
        yield tmp_path
    finally:
        dep.release_model()
        left = kill_mentioning(str(tmp_path))  # a collector this test started
        assert left == [], f"collectors left running: {left}"


def _seeds(tag: str) -> dict[str, int]:
    return {f"{tag}-{i}": i for i in range(ROLLOUTS)}


def _env(dep: CollectDeployment, tmp: Path) -> dict[str, str]:
    return {**os.environ, "ROLLOUT_CHECKPOINT_TOKEN": dep.token, "NO_PROXY": "127.0.0.1", "TMPDIR": str(tmp)}


def _start(
    dep: CollectDeployment, args: list[str], log: Path, *, driver: bool = False
) -> subprocess.Popen[bytes]:
    """``rollout-checkpoint gym collect ARGS``, or (``driver``) Gym's driver hook over them."""
    command = [_DRIVER, f"+rollout_collection_driver={DRIVER}"] if driver else [_CLI, "gym", "collect"]
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-c", *command, *args],
            env=_env(dep, log.parent),
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _wait(what: str, done: Callable[[], bool], timeout_s: float = 90.0) -> None:
    end = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < end, f"not within {timeout_s:.0f} s: {what}"
        time.sleep(0.05)


def _finish(proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 120.0) -> int:
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        raise AssertionError(
            f"the collector did not end within {timeout_s:.0f} s: {log.read_text()[-3000:]}"
        ) from None


def _plans(dep: CollectDeployment, out: Path) -> list[dict[str, int]]:
    """The counts of every checkpoint the collection into ``out`` published, oldest first."""
    store = open_store(dep.store)
    run_id = CollectSettings(store="-", token="-").run_id_for(out)
    plans = [load_checkpoint(store, p.checkpoint_id) for p in list_published(store)]
    mine = sorted((p for p in plans if p.record.run_id == run_id), key=lambda p: p.record.sequence)
    return [{k: int(v) for k, v in p.counts().items()} for p in mine]


def _mid_episode(dep: CollectDeployment, out: Path, seeds: dict[str, int]) -> bool:
    """Every game either is in the output or waits at the gate (after its first step)."""
    held = {c["rollout_id"] for c in dep.held_calls()}
    written = {r["_ng_rollout_id"] for r in read_rows(out)} if out.exists() else set()
    return set(seeds) <= held | written


def _assert_as_uninterrupted(out: Path, seeds: dict[str, int]) -> list[dict[str, Any]]:
    rows = read_rows(out)
    assert sorted(r["_ng_rollout_id"] for r in rows) == sorted(seeds)  # every row once
    reference = reference_run(0, seeds, 6)  # Gym's blackjack and the scripted policy, uninterrupted
    for row in rows:
        ref = reference[row["_ng_rollout_id"]]
        assert row["reward"] == ref["reward"], (row["_ng_rollout_id"], row["reward"], ref)
        assert _texts(row["response"]["output"]) == ref["texts"], row["_ng_rollout_id"]
    return rows


def _resume(dep: CollectDeployment, args: list[str], log: Path) -> str:
    """Re-run the same command; open the model's gate once it restored (a held call of the dead
    run's attempt then meets the fence); returns its log."""
    rerun = _start(dep, args, log)
    _wait(
        "the re-run restores the checkpoint",
        lambda: "restored" in log.read_text() or rerun.poll() is not None,
    )
    dep.release_model()
    code = _finish(rerun, log)
    text = log.read_text()
    assert code == 0, text[-3000:]
    return text


def test_gyms_driver_hook_collects_uninterrupted_checkpointing_on_its_timer(
    dep: CollectDeployment, run: Path
) -> None:
    """The ``rollout_collection_driver`` path (``gym eval run``): as the SDK command, through Gym's hook."""
    seeds = _seeds("timer")
    inp, out, log = write_input(run / "in.jsonl", seeds), run / "out.jsonl", run / "collect.log"
    proc = _start(dep, collect_args(dep, inp, out, checkpoint_every_s=0.2, takeover="true"), log, driver=True)
    _wait("every game is mid-episode or written", lambda: _mid_episode(dep, out, seeds))
    _wait("a timer checkpoint while games wait", lambda: any(p["continue"] for p in _plans(dep, out)))
    dep.release_model()
    assert _finish(proc, log) == 0, log.read_text()[-3000:]
    rows = _assert_as_uninterrupted(out, seeds)
    assert all(r["_ng_attempt_index"] == 0 for r in rows)
    assert "(timer;" in log.read_text()
    assert _plans(dep, out)[-1] == {"completed": ROLLOUTS, "continue": 0, "fresh_dispatch": 0}
    for name in ("out_materialized_inputs.jsonl", "out_failures.jsonl", "out_aggregate_metrics.json"):
        assert (run / name).exists(), name  # Gym's own artifacts


def test_a_sigkilled_collector_resumes_after_a_sigusr1_checkpoint(dep: CollectDeployment, run: Path) -> None:
    seeds = _seeds("kill")
    inp, out = write_input(run / "in.jsonl", seeds), run / "out.jsonl"
    args = collect_args(dep, inp, out, checkpoint_every_s=600, takeover="true")
    proc = _start(dep, args, run / "first.log")
    _wait("every game is mid-episode or written", lambda: _mid_episode(dep, out, seeds))
    written_before = {r["_ng_rollout_id"] for r in read_rows(out)}
    second = _start(dep, args, run / "second.log")  # the same command while the first still runs
    assert _finish(second, run / "second.log") == 1
    assert "another collection is writing" in (run / "second.log").read_text().splitlines()[-1]
    before = len(_plans(dep, out))
    proc.send_signal(signal.SIGUSR1)
    _wait("the SIGUSR1 checkpoint", lambda: len(_plans(dep, out)) > before)
    assert proc.poll() is None  # SIGUSR1: checkpoint and go on
    last = _plans(dep, out)[-1]
    assert last["continue"] >= 1 and last["completed"] == len(written_before), last
    proc.kill()
    proc.wait(10)
    text = _resume(dep, args, run / "rerun.log")
    rows = _assert_as_uninterrupted(out, seeds)
    attempts = {r["_ng_rollout_id"]: r["_ng_attempt_index"] for r in rows}
    assert all(attempts[r] == 0 for r in written_before)  # a written row never ran again
    assert sum(1 for a in attempts.values() if a == 1) == last["continue"]  # continued as attempt N+1
    assert _plans(dep, out)[-1] == {"completed": ROLLOUTS, "continue": 0, "fresh_dispatch": 0}, text[-2000:]


def test_sigterm_checkpoints_exits_75_and_the_rerun_resumes(dep: CollectDeployment, run: Path) -> None:
    seeds = _seeds("term")
    inp, out, log = write_input(run / "in.jsonl", seeds), run / "out.jsonl", run / "first.log"
    args = collect_args(dep, inp, out, checkpoint_every_s=600, takeover="true")
    proc = _start(dep, args, log)
    _wait("every game is mid-episode or written", lambda: _mid_episode(dep, out, seeds))
    proc.send_signal(signal.SIGTERM)
    assert _finish(proc, log) == 75, log.read_text()[-3000:]
    assert _plans(dep, out)[-1]["continue"] >= 1
    _resume(dep, args, run / "rerun.log")
    rows = _assert_as_uninterrupted(out, seeds)
    # Gym's own aggregation over the output, unchanged
    merged = run / "agg" / "merged.jsonl"
    agg = subprocess.run(
        [sys.executable, "-c", _GYM.format(name="ng_aggregate_rollouts"), "+head_server.host=127.0.0.1",
         f"+head_server.port={dep.head_port}", f"+input_glob={out}", f"+output_jsonl_fpath={merged}"],
        env=_env(dep, run), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert agg.returncode == 0, agg.stdout[-2000:] + agg.stderr[-2000:]
    metrics = json.loads((run / "agg" / "merged_aggregate_metrics.json").read_text())
    mean = sum(r["reward"] for r in rows) / len(rows)
    assert mean in _numbers(metrics), metrics


def _numbers(value: Any) -> list[float]:
    if isinstance(value, dict):
        return [n for v in value.values() for n in _numbers(v)]
    if isinstance(value, list):
        return [n for v in value for n in _numbers(v)]
    return [float(value)] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


@pytest.mark.parametrize("server", ["resources", "agent", "model"])
def test_a_server_killed_under_the_collector_ends_it_with_75_and_the_rerun_resumes(
    dep: CollectDeployment, run: Path, server: str
) -> None:
    seeds = _seeds(f"lost-{server}")
    inp, out, log = write_input(run / "in.jsonl", seeds), run / "out.jsonl", run / "first.log"
    args = collect_args(dep, inp, out, checkpoint_every_s=600, takeover="true")
    proc = _start(dep, args, log)
    _wait("every game is mid-episode or written", lambda: _mid_episode(dep, out, seeds))
    before = len(_plans(dep, out))
    proc.send_signal(signal.SIGUSR1)
    _wait("the SIGUSR1 checkpoint", lambda: len(_plans(dep, out)) > before)
    dep.kill(server)
    dep.restart(server)  # as the launcher does: the replacement starts paused
    assert _finish(proc, log) == 75, log.read_text()[-3000:]
    assert "restarted" in log.read_text() or "does not answer" in log.read_text()
    _resume(dep, args, run / "rerun.log")
    rows = _assert_as_uninterrupted(out, seeds)
    assert any(r["_ng_attempt_index"] == 1 for r in rows)  # continued into the replacement as N+1


def test_the_whole_server_tree_lost_then_a_new_tree_and_the_rerun_resume(tmp_path: Path) -> None:
    """Every server and the collector SIGKILLed (the allocation's ng_run tree gone): a new tree
    on the same store, the same command (its new head server), and the output is complete."""
    store, seeds = str(tmp_path / "store"), _seeds("tree")
    inp, out = write_input(tmp_path / "in.jsonl", seeds), tmp_path / "out.jsonl"
    first = CollectDeployment(CollectServers(store=store, workdir=tmp_path / "a", model_delay_s=0.05))
    try:
        first.start_all()
        first.hold_model()
        proc = _start(first, collect_args(first, inp, out, checkpoint_every_s=0.2), tmp_path / "first.log")
        _wait(
            "a checkpoint while games wait mid-episode",
            lambda: any(p["continue"] for p in _plans(first, out)),
        )
        proc.kill()
        proc.wait(10)
        for name in first.all_names():
            first.kill(name)
    finally:
        first.stop()
    second = CollectDeployment(CollectServers(store=store, workdir=tmp_path / "b", model_delay_s=0.05))
    try:
        second.start_all()
        log = tmp_path / "rerun.log"
        rerun = _start(second, collect_args(second, inp, out, checkpoint_every_s=600), log)
        assert _finish(rerun, log) == 0, log.read_text()[-3000:]
        assert "restored" in log.read_text()
        rows = _assert_as_uninterrupted(out, seeds)
        assert any(r["_ng_attempt_index"] == 1 for r in rows)  # continued in the new tree as N+1
        assert _plans(second, out)[-1] == {"completed": ROLLOUTS, "continue": 0, "fresh_dispatch": 0}
    finally:
        second.stop()
        left = kill_mentioning(str(tmp_path))
        assert left == [], f"processes left running: {left}"
