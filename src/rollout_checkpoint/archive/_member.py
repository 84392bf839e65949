"""What the archive needs of a record it writes, as a protocol: the format's record models
(:mod:`rollout_checkpoint.format.records`) satisfy it, and the archive never imports them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

__all__ = ["ArchiveMember"]


class ArchiveMember(Protocol):
    """A record :meth:`ArchiveWriter.write <rollout_checkpoint.archive.ArchiveWriter.write>` takes."""

    @property
    def kind(self) -> str: ...
    @property
    def rollout_id(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def record_key(self) -> str: ...
    @property
    def schema_version(self) -> int: ...

    def index_revision(self) -> int | None: ...
    def index_refs(self) -> Mapping[str, Any] | None: ...
    def to_payload(self) -> bytes: ...
