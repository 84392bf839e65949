"""Regenerates ``archive-v1/``: a small component archive in on-storage format version 1.

Run once with the code of format version 1 (commit 3ef5e27) and committed, so that
``tests/test_archive_compat.py`` checks that later readers still read and verify it:

    python tests/data/make_archive_v1.py
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from rollout_checkpoint.archive import ArchiveWriter
from rollout_checkpoint.format.records import (
    AgentBoundaryRecord,
    CompletedResultRecord,
    DispatchRecord,
    ModelCallLineageRecord,
    Record,
    ResourceSnapshotRecord,
)
from rollout_checkpoint.store import LocalStore

HERE = Path(__file__).resolve().parent
ROOT = HERE / "archive-v1"
PREFIX = "checkpoints/ck-v1/components/agent/agent-0"


def records() -> list[Record]:
    out: list[Record] = []
    for i in range(60):
        rid = f"r{i // 5:03d}"
        kind = i % 5
        if kind == 0:
            out.append(
                AgentBoundaryRecord(
                    rollout_id=rid, attempt=0, boundary_index=i, turn_index=i % 3,
                    last_model_call_id=f"call-{i}", resource_revisions={"env": i},
                    output_items=[{"text": "turn " * (i % 7)}, i], agent_state=bytes(range(i % 50)),
                )
            )  # fmt: skip
        elif kind == 1:
            out.append(
                ResourceSnapshotRecord(
                    rollout_id=rid, attempt=0, session_id=f"s{i}", revision=i, codec="raw",
                    state=b"state-%d" % i,
                )
            )  # fmt: skip
        elif kind == 2:
            out.append(
                ModelCallLineageRecord(
                    rollout_id=rid, attempt=0, call_id=f"call-{i}", policy_version="v1", token_key=f"tok/{i}"
                )
            )
        elif kind == 3:
            out.append(CompletedResultRecord(rollout_id=rid, attempt=1, result={"answer": i}, reward=i / 10))
        else:
            out.append(DispatchRecord(rollout_id=rid, attempt=0, state="running", input_digest=f"d{i}"))
    return out


def main() -> None:
    shutil.rmtree(ROOT, ignore_errors=True)
    store = LocalStore(str(ROOT))
    writer = ArchiveWriter(
        store, PREFIX, checkpoint_id="ck-v1", participant_kind="agent", instance="agent-0",
        target_shard_bytes=2048, row_group_rows=8,
    )  # fmt: skip
    recs = records()
    for rec in recs:
        writer.write(rec)
    writer.commit(extra={"fixture": "format version 1"})
    with open(HERE / "archive-v1.expected.jsonl", "w") as fh:
        for rec in recs:
            line = {"kind": rec.kind, "record": rec.model_dump(mode="json")}
            fh.write(json.dumps(line, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
