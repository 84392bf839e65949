"""What makes a repeated control call give the same answer: cached replies and resumed ids."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from ._types import CommitReply, PrepareReport, RestoreReply

__all__ = ["RESUMED_IDS_KEPT", "ReplyCache", "ResumedIds"]

RESUMED_IDS_KEPT = 1024
"""How many resumed checkpoint ids a participant remembers (``stale_checkpoint``). An id older
than the last 1024 resumed ones is forgotten; coordinators never reuse ids, so this only bounds
memory, it does not reopen a real hole."""


@dataclass
class ReplyCache:
    """The answers given for the active checkpoint, returned again to a repeated call."""

    prepare: PrepareReport | None = None
    commit: CommitReply | None = None
    restore: RestoreReply | None = None

    def clear(self) -> None:
        self.prepare = None
        self.commit = None
        self.restore = None


class ResumedIds:
    """The last :data:`RESUMED_IDS_KEPT` resumed checkpoint ids, oldest forgotten first."""

    def __init__(self) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, checkpoint_id: object) -> bool:
        return checkpoint_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def remember(self, checkpoint_id: str) -> None:
        self._ids[checkpoint_id] = None
        self._ids.move_to_end(checkpoint_id)
        while len(self._ids) > RESUMED_IDS_KEPT:
            self._ids.popitem(last=False)
