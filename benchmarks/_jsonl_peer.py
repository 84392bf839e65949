"""The JSONL baseline: what NeMo Gym's participant store (``nemo_gym/_checkpoint/store.py``) does.

Written here so the comparison runs in the same process model and on the same disk:

* one JSONL file per participant, one ``json.dumps`` line per record;
* the lines are streamed through SHA-256 into a temp file, which is fsynced and renamed to its
  digest (``<sha256>.jsonl``);
* ``manifest.json`` is written last, through a temp file, fsync and a hard link that refuses an
  existing name (``os.link`` raises ``FileExistsError``);
* one fsync of the folder at the end.

No index, no compression, no object store. A lookup reads the manifest and scans the
participant's file line by line (``json.loads`` of each line) until the record is found; reading
everything is ``json.loads`` of every line. Neither re-checks the file's digest (the most
favourable reading for the baseline).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["JsonlParticipantWriter", "commit_manifest", "lookup", "read_all"]

MANIFEST = "manifest.json"


class JsonlParticipantWriter:
    """One participant's JSONL file: lines go through SHA-256 into a temp file."""

    def __init__(self, root: Path, participant: str) -> None:
        self.root = root
        self.participant = participant
        self._tmp = root / f".{participant}.jsonl.tmp"
        self._fh = open(self._tmp, "wb")  # noqa: SIM115 - closed in finish()
        self._sha = hashlib.sha256()
        self.records = 0
        self.bytes = 0

    def write(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record) + "\n").encode()
        self._sha.update(line)
        self._fh.write(line)
        self.records += 1
        self.bytes += len(line)

    def finish(self) -> dict[str, Any]:
        """fsync, rename to the digest; the manifest entry of this participant."""
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        digest = self._sha.hexdigest()
        name = f"{digest}.jsonl"
        os.rename(self._tmp, self.root / name)
        return {"file": name, "sha256": digest, "records": self.records, "bytes": self.bytes}


def commit_manifest(root: Path, participants: dict[str, dict[str, Any]]) -> None:
    """manifest.json last: temp file, fsync, hard link refusing an existing name; fsync the folder."""
    tmp = root / ".manifest.json.tmp"
    with open(tmp, "wb") as fh:
        fh.write(json.dumps({"participants": participants}, sort_keys=True).encode())
        fh.flush()
        os.fsync(fh.fileno())
    os.link(tmp, root / MANIFEST)  # FileExistsError when a manifest is already there
    os.unlink(tmp)
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _participant_file(root: Path, participant: str) -> Path:
    manifest = json.loads((root / MANIFEST).read_bytes())
    return root / manifest["participants"][participant]["file"]


def lookup(root: Path, participant: str, rollout_id: str) -> dict[str, Any] | None:
    """Scan the participant's file until the record of ``rollout_id``."""
    with open(_participant_file(root, participant), "rb") as fh:
        for line in fh:
            record: dict[str, Any] = json.loads(line)
            if record["rollout_id"] == rollout_id:
                return record
    return None


def read_all(root: Path, participant: str) -> list[dict[str, Any]]:
    with open(_participant_file(root, participant), "rb") as fh:
        return [json.loads(line) for line in fh]
