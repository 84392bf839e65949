"""Which component archives retention must keep because a retained archive refers into them.

Format version 2 archives name their *bases* (earlier archives that store members they list):
those archives must outlive every checkpoint whose components name them, even once their own
checkpoint is unpublished. References are flattened (a base always stores the rows itself), so
one level of ``bases`` is the whole reachable set. A worker group's component names its
workers' *parts* (``<component>/parts/<worker_id>``) as bases too, this checkpoint's and, through
them, earlier checkpoints' parts: an earlier part stays while its own checkpoint's component
manifest goes. The bases of a kept base are not followed: a reader of the retained checkpoint
never opens them, and keeping the closure would keep a run's whole history (``docs/format.md``,
"What retention keeps and what verify checks").
"""

from __future__ import annotations

from collections.abc import Iterable

from ..archive import find_component_prefixes, parse_component_manifest
from ..errors import CheckpointError, ObjectNotFoundError, StoreError
from ..format import layout
from ..store import ObjectStore

__all__ = ["referenced_prefixes", "under_protected"]


def referenced_prefixes(store: ObjectStore, checkpoint_ids: Iterable[str]) -> set[str] | None:
    """Component prefixes that the component manifests under ``checkpoints/<id>/`` of
    ``checkpoint_ids`` name as bases; ``None`` when one of those manifests cannot be read
    (then nobody knows what it needs, and the caller deletes no checkpoint object)."""
    out: set[str] = set()
    for cid in sorted(set(checkpoint_ids)):
        for prefix in find_component_prefixes(store, layout.checkpoint_prefix(cid) + "/"):
            try:
                manifest = parse_component_manifest(store.get(f"{prefix}/{layout.MANIFEST_NAME}"))
            except ObjectNotFoundError:
                continue  # deleted meanwhile: it needs nothing any more
            except StoreError:
                raise
            except CheckpointError:
                return None
            out.update(b.prefix for b in manifest.bases or [])
    return out


def under_protected(key: str, protected: set[str]) -> bool:
    """Whether object ``key`` lies in one of the ``protected`` component prefixes."""
    return any(key.startswith(prefix + "/") for prefix in protected)
