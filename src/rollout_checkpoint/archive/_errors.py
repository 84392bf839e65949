"""Errors specific to the archive layer (the shared ones live in :mod:`rollout_checkpoint.errors`)."""

from __future__ import annotations

from ..errors import CheckpointError

__all__ = ["ArchiveStateError", "MemberNotFoundError"]


class MemberNotFoundError(CheckpointError, KeyError):
    """The archive's member index has no member with that (kind, rollout_id, attempt, key)."""

    code = "member_not_found"

    def __str__(self) -> str:
        # KeyError.__str__ would repr() the message; keep it readable.
        return self.message


class ArchiveStateError(CheckpointError):
    """The writer was used out of order: a write after commit/abort, or a ref asked before commit."""

    code = "archive_state"
