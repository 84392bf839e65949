"""Object names inside an archive prefix that layers above may need without loading pyarrow."""

from __future__ import annotations

import re

__all__ = ["MANIFEST_NAME", "PARTS_DIR", "is_part_of", "part_prefix"]

MANIFEST_NAME = "manifest.json"
"""The component manifest's name under an archive prefix (written last, create-only)."""

PARTS_DIR = "parts"
"""Folder of an archive's *parts*: archives of the same checkpoint, kind and instance at
``<prefix>/parts/<part_id>`` that it refers to (a worker group's workers write one each)."""

_PART_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def part_prefix(prefix: str, part_id: str) -> str:
    """``<prefix>/parts/<part_id>`` (``part_id`` validated by the caller's id rules)."""
    return f"{prefix}/{PARTS_DIR}/{part_id}"


def is_part_of(candidate: str, prefix: str) -> bool:
    """Whether ``candidate`` is ``<prefix>/parts/<id>`` for one valid id (no deeper folder)."""
    head = f"{prefix}/{PARTS_DIR}/"
    if not candidate.startswith(head):
        return False
    part_id = candidate[len(head) :]
    return len(part_id) <= 128 and ".." not in part_id and bool(_PART_ID.match(part_id))
