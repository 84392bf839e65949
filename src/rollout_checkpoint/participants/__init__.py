"""Reference participants, one module per kind: agent, resources/environment, policy model.

Each has a small integration API a server calls from its request handlers (``docs/participants.md``
shows the calls in context). All of them inherit the control plane of
:class:`~rollout_checkpoint.protocol.Participant`: the coordinator drives ``prepare`` /
``commit`` / ``restore`` / ``resume`` / ``retire`` / ``forget``; the server's worker threads
call the kinds' methods concurrently.
"""

from __future__ import annotations

from .agent import AgentParticipant
from .codecs import JsonCodec, StateCodec
from .generation import FakeGenerationBackend, FrozenBuffer, GenerationOutput, InlinePrefix, StagedPrefix
from .model import (
    CutAcknowledgement,
    CutInventory,
    CutReport,
    CutTicket,
    GenerationResult,
    ModelCall,
    PolicyModelParticipant,
    check_cut_evidence,
    validate_cut_coverage,
)
from .resources import ResourcesParticipant

__all__ = [
    "AgentParticipant",
    "CutAcknowledgement",
    "CutInventory",
    "CutReport",
    "CutTicket",
    "FakeGenerationBackend",
    "FrozenBuffer",
    "GenerationOutput",
    "GenerationResult",
    "InlinePrefix",
    "JsonCodec",
    "ModelCall",
    "PolicyModelParticipant",
    "ResourcesParticipant",
    "StagedPrefix",
    "StateCodec",
    "check_cut_evidence",
    "validate_cut_coverage",
]
