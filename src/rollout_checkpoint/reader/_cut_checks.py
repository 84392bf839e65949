"""What the recovery reader checks of generation cuts (``docs/protocol.md``, "Generation cuts").

Classification reads member indexes only: a ``model_lineage`` member's refs carry ``parent``,
``token_key`` and, for a cut call, ``cut`` = ``{kind, count, digest, receipt_digest,
receipt_length}``; a ``token_receipt`` member's refs carry ``digest`` and ``length``.

* :func:`cut_receipt_conflicts` - a cut whose coordinates disagree with the token receipt of its
  own key (digest or length): the participant wrote an inconsistent component, so the whole
  checkpoint is rejected;
* :func:`cut_lineage_problem` - a cut call that is not a child of the last delivered call (the
  model participant would refuse to restore it): the rollout is a fresh dispatch;
* :func:`verify_cut_tokens` - ``verify`` only (reads token data): every cut's stored prefix
  hashes to its ``digest`` and has ``count`` tokens.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..archive import MemberRef
from ..errors import IntegrityError
from ..store import ObjectStore
from ..tokens import TokenSnapshotEntry, prefix_digest, read_entry

__all__ = ["cut_lineage_problem", "cut_receipt_conflicts", "verify_cut_tokens"]


def cut_receipt_conflicts(
    calls: Mapping[str, Mapping[str, Any]], receipts: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """Reasons (one per bad cut) why one execution's cut coordinates disagree with its receipts."""
    out: list[str] = []
    for call_id, refs in sorted(calls.items()):
        cut = refs.get("cut")
        if cut is None:
            continue
        if not isinstance(cut, Mapping):
            out.append(f"cut of model call {call_id!r} is not an object")
            continue
        receipt = receipts.get(str(refs.get("token_key")))
        if receipt is None:
            continue  # a missing receipt makes the rollout a fresh dispatch (classification)
        if (cut.get("receipt_digest"), cut.get("receipt_length")) != (
            receipt.get("digest"),
            receipt.get("length"),
        ):
            out.append(
                f"cut of model call {call_id!r} names token receipt digest {cut.get('receipt_digest')} "
                f"({cut.get('receipt_length')} bytes), its receipt says {receipt.get('digest')} "
                f"({receipt.get('length')} bytes)"
            )
    return out


def cut_lineage_problem(calls: Mapping[str, Mapping[str, Any]]) -> str | None:
    """Why one execution's cut calls cannot be continued, or ``None``.

    The delivered calls (no ``cut``) must form one chain; every cut call's parent must be its tip.
    """
    delivered = {c: r for c, r in calls.items() if r.get("cut") is None}
    parents = {r.get("parent") for r in delivered.values()}
    tips = [c for c in delivered if c not in parents]
    if len(tips) > 1:
        return f"model lineage has {len(tips)} tips {sorted(tips)[:3]}"
    tip = tips[0] if tips else None
    for call_id, refs in sorted(calls.items()):
        if refs.get("cut") is not None and refs.get("parent") != tip:
            return f"cut model call {call_id!r} is not a child of the last delivered call {tip!r}"
    return None


def verify_cut_tokens(
    store: ObjectStore, entries: Mapping[str, TokenSnapshotEntry], members: Iterable[MemberRef]
) -> int:
    """Read each cut's prefix from the token store and check its count and digest; returns how
    many were checked. ``IntegrityError`` names the first call whose tokens disagree."""
    checked = 0
    for member in members:
        refs = member.refs or {}
        cut = refs.get("cut")
        if member.kind != "model_lineage" or not isinstance(cut, Mapping):
            continue
        key = str(refs.get("token_key"))
        located = entries.get(key)
        if located is None:
            raise IntegrityError(
                f"cut of {member.rollout_id}#{member.attempt}/{member.key}: no token entry {key}"
            )
        tokens = read_entry(store, located, key).generation_token_ids
        if len(tokens) != cut.get("count") or prefix_digest(tokens) != cut.get("digest"):
            raise IntegrityError(
                f"cut of {member.rollout_id}#{member.attempt}/{member.key}: the {len(tokens)} stored tokens "
                f"do not match its coordinates ({cut.get('count')} tokens, digest {cut.get('digest')})",
                problem="digest_mismatch",
            )
        checked += 1
    return checked
