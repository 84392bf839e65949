"""The on-store format: record models, object layout, the publisher's documents (manifests), the
commit log (create-only records, sequence claims, the ``latest`` pointer), attempt tombstones
(fencing), columnar record batches, and decoded reads over an archive.

``docs/format.md`` and ``docs/protocol.md`` are the specification; these modules are its
reference implementation. Layer: above ``archive`` and ``store``; never imports ``tokens``, the
protocol, participants, the registry, the reader or anything above them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

if TYPE_CHECKING:
    from .record_reader import ArchiveReader

__getattr__ = lazy_getattr(__name__, {"ArchiveReader": ".record_reader"})

__all__ = ["ArchiveReader"]
