"""The reader: load a published checkpoint, verify its digests, reconcile what the participants
wrote and classify every rollout ``completed``, ``continue`` or ``fresh_dispatch`` (or reject
the checkpoint). Following a checkpoint id through a restore stays inside this package.

Modules: ``_plan`` (what it returns), ``_load`` (resolve, load, verify), ``_classify`` (the
disposition rules), ``_reconcile`` (cross-component agreement), ``_cut_checks`` (generation-cut
evidence). Layer: above ``registry``, ``tokens`` and ``format``; never imports participants,
the coordinator, the server, the CLI or the demo.
"""

from __future__ import annotations

from ._classify import ComponentSummary, TokenSnapshotView
from ._load import list_checkpoints, load_checkpoint, resolve_checkpoint_id, verify_checkpoint
from ._plan import (
    LoadedCheckpoint,
    RecoveryPlan,
    SkippedCheckpoint,
    TokenSnapshotLoader,
    VerifyReport,
    default_token_snapshot_loader,
)
from ._rollouts import DISPOSITIONS, Disposition, RolloutPlan, RolloutPlans

__all__ = [
    "DISPOSITIONS",
    "ComponentSummary",
    "Disposition",
    "LoadedCheckpoint",
    "RecoveryPlan",
    "RolloutPlan",
    "RolloutPlans",
    "SkippedCheckpoint",
    "TokenSnapshotLoader",
    "TokenSnapshotView",
    "VerifyReport",
    "default_token_snapshot_loader",
    "list_checkpoints",
    "load_checkpoint",
    "resolve_checkpoint_id",
    "verify_checkpoint",
]
