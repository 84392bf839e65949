"""The collection's settings and its user-facing mistakes (one line, exit 1), and the ledger's
rules on a real registry: a row is handed off only once it is in the output; after a restore a
row already written is completed, one the checkpoint does not list is fenced and sent as its
next attempt."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from _gym import require_gym

require_gym()

from rollout_checkpoint.errors import CheckpointError, InvalidArgumentError  # noqa: E402
from rollout_checkpoint.ids import ExecutionId  # noqa: E402
from rollout_checkpoint.integrations.nemo_gym._collect_ledger import CollectionLedger  # noqa: E402
from rollout_checkpoint.integrations.nemo_gym.collect import CollectSettings, server_urls  # noqa: E402
from rollout_checkpoint.registry import LiveExecutionRegistry  # noqa: E402

_CLI = "import sys; from rollout_checkpoint.cli import main; sys.argv[0] = 'rollout-checkpoint'; main()"


def test_settings_come_from_the_config_block_and_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ROLLOUT_CHECKPOINT_STORE", raising=False)
    monkeypatch.setenv("ROLLOUT_CHECKPOINT_TOKEN", "tok")
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    cli = {"store": "s3://b/run", "checkpoint_every_s": 30, "token_file": str(token_file)}
    settings = CollectSettings.from_config(cli, {"store": "ignored", "participants": ["a", "b"]})
    assert (settings.store, settings.token, settings.checkpoint_every_s) == ("s3://b/run", "from-file", 30.0)
    assert settings.participants == ("a", "b")
    out = tmp_path / "out.jsonl"
    assert settings.run_id_for(out) == settings.run_id_for(tmp_path / "." / "out.jsonl")  # a re-run resumes
    assert settings.run_id_for(out) != settings.run_id_for(tmp_path / "other.jsonl")
    for block, word in (
        ({}, "no checkpoint store"),
        ({"store": "x", "token": "inline"}, "token_file"),
        ({"store": "x", "checkpoint_every": 5}, "unknown"),
        ({"store": "x", "checkpoint_every_s": 0}, "positive"),
        ({"store": "x", "run_id": "../up"}, "run_id"),
    ):
        with pytest.raises(CheckpointError, match=word):
            CollectSettings.from_config(block)


def test_participants_are_every_server_but_a_stateless_relay() -> None:
    config = {
        "head_server": {"host": "127.0.0.1", "port": 1},
        "m": {"responses_api_models": {"scripted": {"host": "127.0.0.1", "port": 2}}},
        "r": {"resources_servers": {"blackjack": {"host": "127.0.0.1", "port": 3}}},
        "a": {"responses_api_agents": {"gymnasium_agent": {"host": "127.0.0.1", "port": 4}}},
        "relay": {"environment_servers": {"legacy_agent": {"host": "127.0.0.1", "port": 5}}},
        "env": {"environment_servers": {"single_agent_turn": {"host": "127.0.0.1", "port": 6}}},
    }
    assert sorted(server_urls(config, None)) == ["a", "env", "m", "r"]
    assert server_urls(config, ("m",)) == {"m": "http://127.0.0.1:2"}
    with pytest.raises(InvalidArgumentError, match="nope"):
        server_urls(config, ("nope",))


def test_a_row_is_handed_off_only_once_it_is_in_the_output(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    ledger = CollectionLedger(LiveExecutionRegistry(), out)
    rows = [{"_ng_task_index": i, "_ng_rollout_index": 0} for i in range(2)]
    ledger.stamp(rows)
    assert [(r["_ng_rollout_id"], r["_ng_attempt_index"]) for r in rows] == [("0-0", 0), ("1-0", 0)]
    with pytest.raises(InvalidArgumentError, match="two rows"):  # num_repeats copies an explicit id
        ledger.stamp([{"_ng_rollout_id": "x", "_ng_task_index": 0, "_ng_rollout_index": i} for i in range(2)])
    for row in rows:
        assert ledger.started(row) == ExecutionId(rollout_id=row["_ng_rollout_id"], attempt=0)
        ledger.finished(row)
    assert ledger.hand_off_written() == 0  # finished, not written
    out.write_text(json.dumps({**rows[0], "reward": 1.0}) + "\n" + json.dumps(rows[1])[:10])  # half a line
    assert ledger.hand_off_written() == 1
    assert ledger.registry.counts() == {"finished": 1, "handed_off": 1}
    assert ledger.registry.pending_results()[0].reward == 1.0


def test_reconcile_completes_written_rows_and_fences_unlisted_ones(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    registry = LiveExecutionRegistry()
    continued = registry.dispatch("0-0")  # as a restore leaves a continued rollout: attempt 1 running
    registry.start(continued)
    registry.retire(continued)
    registry.start(registry.dispatch("0-0"))
    registry.start(registry.dispatch("1-0"))
    registry.retire(registry.get("1-0").execution)
    registry.start(registry.dispatch("1-0"))
    out.write_text(json.dumps({"_ng_rollout_id": "1-0", "_ng_attempt_index": 0, "reward": 0.5}) + "\n")
    retired: list[ExecutionId] = []

    def retire(batch: list[ExecutionId]) -> None:
        retired.extend(batch)
        for execution in batch:
            registry.retire(execution)

    ledger = CollectionLedger(registry, out)
    counts = ledger.reconcile(["0-0", "1-0", "2-0"], retire)
    assert counts == {"completed_in_output": 1, "retired_unknown": 1, "retired_written": 1}
    # 1-0 was written after the checkpoint: fenced at attempt 1, completed; 2-0 was unlisted
    assert retired == [ExecutionId(rollout_id="1-0", attempt=1), ExecutionId(rollout_id="2-0", attempt=0)]
    assert registry.get("1-0").state == "handed_off"
    rows = [{"_ng_rollout_id": r} for r in ("0-0", "2-0")]
    ledger.stamp(rows)
    assert [r["_ng_attempt_index"] for r in rows] == [1, 1]  # continued as N+1; unlisted after its fence


@pytest.mark.parametrize(
    ("extra", "says"),
    [(["+rollout_checkpoint.store=memory://x", "+head_server.port=9"], "head server")],  # none listens
)
def test_a_users_mistake_is_one_line(tmp_path: Path, extra: list[str], says: str) -> None:
    args = [f"+input_jsonl_fpath={tmp_path / 'in.jsonl'}", f"+output_jsonl_fpath={tmp_path / 'o.jsonl'}"]
    env = {
        "PATH": "/usr/bin",
        "HOME": str(tmp_path),
        "ROLLOUT_CHECKPOINT_TOKEN": "t",
        "NO_PROXY": "127.0.0.1",
    }
    out = subprocess.run(
        [sys.executable, "-c", _CLI, "gym", "collect", *args, *extra],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert lines[-1].startswith("error (invalid_argument):") and says in lines[-1], out.stderr
