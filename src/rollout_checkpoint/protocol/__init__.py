"""The checkpoint protocol: its transport-neutral types and the in-process participant machinery.

``_types`` holds what every transport shares (phases, capabilities, the replies,
:class:`ParticipantControl`, the prepare order); the other modules are the in-process control
plane (phases, admission gate, lease, idempotency). Layer: above ``format``, beside ``tokens``
(never imports it); never imports participants, the registry, the reader, the coordinator, the
server or anything above them.

:class:`Participant` implements :class:`ParticipantControl` once
for every kind of server; a subclass (the reference kinds are in
:mod:`rollout_checkpoint.participants`) only says what "ready" means (:class:`Readiness`), what
it exports (:class:`Export`) and how it validates and installs restored state.

Phases::

    idle --prepare--> preparing --(ready)--> prepared --commit--> committed
    idle --restore--> restored
    any  --resume---> idle          (resume is also abort; a lease expiry is a resume)

Rules every operation follows (see ``docs/participants.md``):

* it carries a ``checkpoint_id`` (validated as an id) and an absolute ``deadline`` (epoch
  seconds); an already expired deadline raises ``deadline_exceeded`` and changes nothing;
* repeating it for the same id is idempotent and returns the same answer (commit exports and
  writes its manifest exactly once);
* a different active id is ``checkpoint_conflict``; an id already resumed is
  ``stale_checkpoint`` forever after (the last :data:`RESUMED_IDS_KEPT` ids are remembered), so a
  late prepare can never close admission again;
* while a checkpoint is active a lease (latest deadline + ``lease_grace_seconds``) runs; when it
  expires the participant resumes by itself, checked lazily on every call and by a timer thread.

One condition variable (``self._cond``) guards all state, the subclass's included: subclasses
mutate their state while holding it and call ``_changed()`` when work reaches a safe boundary,
which wakes a waiting prepare (no busy-wait).

Modules, bottom up: ``_lease`` (deadlines, the lease), ``_idempotency`` (cached replies,
resumed ids), ``_hooks`` (what a kind hands back), ``_phases`` (state and transitions),
``_admission`` (the gate for new work, live executions), ``_component`` (archive I/O of commit
and restore), ``_commit_restore`` (the operations that do that I/O), ``_participant`` (the
in-lock operations, the class kinds subclass).
"""

from __future__ import annotations

from ._cancel import Cancellation
from ._export_rows import (
    DeferredExecutions,
    ExportRows,
    FrozenRows,
    ScopeSource,
    deferred_scope,
    resolve_scope,
)
from ._hooks import (
    BLOCKERS_REPORTED,
    DeferredBatches,
    Export,
    ExportRecords,
    Readiness,
    RecordBatch,
    RecordBatches,
    execution_key,
    in_scope_items,
    restamp,
    scope_frozenset,
    scope_test,
    wrong_kind,
)
from ._idempotency import RESUMED_IDS_KEPT
from ._lease import DEFAULT_LEASE_GRACE_SECONDS, MAX_DEADLINE_SECONDS
from ._participant import Participant
from ._publication import launches_deferred
from ._rows_export import RowsExport
from ._types import (
    CONTROL_SCHEMA_VERSION,
    INCARNATION_PATTERN,
    PREPARE_ORDER,
    AsyncParticipantControl,
    Capabilities,
    CheckpointMode,
    CommitReply,
    ConcurrencyContract,
    Incarnation,
    ParticipantControl,
    ParticipantKind,
    ParticipantStatus,
    Phase,
    PrepareReport,
    Publication,
    PublicationFailedError,
    PublicationUnknownError,
    RestoreReply,
    ResumeReply,
    UnsafeEffect,
    WorkerTopology,
    new_incarnation,
)

__all__ = [
    "BLOCKERS_REPORTED",
    "CONTROL_SCHEMA_VERSION",
    "DEFAULT_LEASE_GRACE_SECONDS",
    "INCARNATION_PATTERN",
    "MAX_DEADLINE_SECONDS",
    "PREPARE_ORDER",
    "RESUMED_IDS_KEPT",
    "AsyncParticipantControl",
    "Cancellation",
    "Capabilities",
    "CheckpointMode",
    "CommitReply",
    "ConcurrencyContract",
    "DeferredBatches",
    "DeferredExecutions",
    "Export",
    "ExportRecords",
    "ExportRows",
    "FrozenRows",
    "Incarnation",
    "Participant",
    "ParticipantControl",
    "ParticipantKind",
    "ParticipantStatus",
    "Phase",
    "PrepareReport",
    "Publication",
    "PublicationFailedError",
    "PublicationUnknownError",
    "Readiness",
    "RecordBatch",
    "RecordBatches",
    "RowsExport",
    "RestoreReply",
    "ResumeReply",
    "ScopeSource",
    "UnsafeEffect",
    "WorkerTopology",
    "deferred_scope",
    "execution_key",
    "in_scope_items",
    "launches_deferred",
    "new_incarnation",
    "resolve_scope",
    "restamp",
    "scope_frozenset",
    "scope_test",
    "wrong_kind",
]
