"""The policy model participant, split by concept.

``_participant`` (:class:`PolicyModelParticipant`: admission, generations, cuts, export,
restore), ``_cuts`` (inventories, acknowledgements, the coverage check, evidence against the
token store), ``_chain`` (one execution's lineage; rebuilding chains from a checkpoint). The
fake generation backend it drives is :mod:`rollout_checkpoint.participants.generation`.
"""

from __future__ import annotations

from ._chain import PendingCut
from ._cuts import (
    CutAcknowledgement,
    CutDisposition,
    CutInventory,
    CutReport,
    CutTicket,
    check_cut_evidence,
    cut_call_id,
    validate_cut_coverage,
)
from ._participant import Delivery, GenerationResult, ModelCall, PolicyModelParticipant

__all__ = [
    "CutAcknowledgement",
    "CutDisposition",
    "CutInventory",
    "CutReport",
    "CutTicket",
    "Delivery",
    "GenerationResult",
    "ModelCall",
    "PendingCut",
    "PolicyModelParticipant",
    "check_cut_evidence",
    "cut_call_id",
    "validate_cut_coverage",
]
