"""The framework-side coordinator: the checkpoint cycle, restore and explicit resume.

The cycle (``docs/protocol.md``, "Checkpoint cycle")::

    freeze dispatch -> prepare (stage by stage, PREPARE_ORDER) -> commit -> validate components
    -> registry component -> aggregate manifest (create-only) -> token-store snapshot
    -> GLOBAL CHECKPOINT RECORD (create-only: the commit point) -> latest pointer (CAS)
    -> resume (reverse order)

With ``publication="async"`` (``docs/protocol.md``, "Asynchronous publication") the commit only
freezes each participant's snapshot and the registry's, the participants are resumed at once,
and the rest (upload, validation, aggregate, token snapshot, record, pointer) runs on a
background thread; :meth:`Coordinator.checkpoint_async` returns a :class:`PublicationHandle`.

Any failure before the commit point aborts: every participant touched is resumed, nothing is
published, leftovers stay invisible (readers only trust ``published/*.json``). A failure after
it never un-publishes: the outcome reports it. ``fault_hook(step)`` runs before every object
write, every participant call, the commit point and the pointer move, so tests can fail or
kill the process at each step.

Every reply carries the participant's incarnation; the coordinator keeps each one from its last
published checkpoint or restore, and a checkpoint that meets another (a participant restarted
without a restore, or within the cycle) aborts with ``participant_restarted``, nothing
published. Every published record names its cycle's incarnations, and a new coordinator
compares its first checkpoint with those of its run's latest (a restarted driver over a
participant restarted meanwhile is refused too). :meth:`Coordinator.recover` is the answer to a
restart.

Modules: ``_types`` (errors, outcomes, handle), ``_core`` (shared helpers, incarnations),
``_publication`` (validation and the commit point), ``_cycle`` (sync and async cycles),
``_restore`` (restore, resume, retire, forget), ``_recover`` (recover after a crash).
"""

from __future__ import annotations

from ._recover import RecoverOperations
from ._types import (
    RETIRE_ORDER,
    CheckpointCancelledError,
    CheckpointNotReadyError,
    CheckpointOutcome,
    FaultHook,
    MissingParticipantError,
    PublicationHandle,
    RestoreFailedError,
    RestoreOutcome,
    TokenSnapshotSource,
)

__all__ = [
    "RETIRE_ORDER",
    "CheckpointCancelledError",
    "CheckpointNotReadyError",
    "CheckpointOutcome",
    "Coordinator",
    "FaultHook",
    "MissingParticipantError",
    "PublicationHandle",
    "RestoreFailedError",
    "RestoreOutcome",
    "TokenSnapshotSource",
]


class Coordinator(RecoverOperations):
    """Runs checkpoint cycles and restores over a fixed set of participants.

    ``participants`` are any :class:`~rollout_checkpoint.protocol.ParticipantControl` (in-process
    or remote clients), unique by ``(kind, instance)``. ``token_source`` (optional) is snapshotted
    under each checkpoint id and its receipt bound into the global record. One cycle runs at a
    time per coordinator (an asynchronous one until its publication ended); two coordinators
    racing on one checkpoint id cannot both publish.
    """
