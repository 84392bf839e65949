"""Typed errors with stable codes.

Every error the SDK raises on purpose derives from :class:`CheckpointError` and carries a
``code`` that never changes between releases, so callers (and the CLI's ``--json`` output)
can branch on it without parsing messages.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "AdmissionClosedError",
    "CheckpointConflictError",
    "CheckpointError",
    "CheckpointNotFoundError",
    "CheckpointRejectedError",
    "ConditionalWriteUnsupportedError",
    "DeadlineExceededError",
    "DeadlineTooFarError",
    "GenerationCutError",
    "IdentityConflictError",
    "IntegrityError",
    "InvalidArgumentError",
    "InvalidIdentifierError",
    "InvalidPhaseError",
    "InvalidRecordError",
    "InvalidValueError",
    "ManifestConflictError",
    "ObjectExistsError",
    "ObjectNotFoundError",
    "ParticipantRestartedError",
    "SequenceTakenError",
    "StaleAttemptError",
    "StaleCheckpointError",
    "StaleCoordinatorError",
    "StoreError",
    "StoreOwnedError",
    "StorePermissionError",
    "StoreUnreachableError",
    "StoreUnsupportedError",
    "TransientStoreError",
    "UnknownExecutionError",
    "UnsupportedSchemaError",
    "VersionChangedError",
    "refuse_newer_schema",
]


class CheckpointError(Exception):
    """Base class of every error raised by rollout-checkpoint on purpose."""

    code: ClassVar[str] = "checkpoint_error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly ``{"code", "message", "details"}`` form (CLI and HTTP use it)."""
        return {"code": self.code, "message": self.message, "details": self.details}


# --- input validation -------------------------------------------------------------------


class InvalidIdentifierError(CheckpointError, ValueError):
    """An id or object key that would be unsafe as part of an object key."""

    code = "invalid_id"


class InvalidValueError(CheckpointError, ValueError):
    """An argument outside its allowed values (``ResourcesParticipant(mode="bogus")``, say)."""

    code = "invalid_value"


class UnsupportedSchemaError(CheckpointError):
    """A stored record or manifest uses a schema version newer than this reader knows."""

    code = "unsupported_schema"


def refuse_newer_schema(what: str, version: object, supported: int) -> None:
    """Raise :class:`UnsupportedSchemaError` if a stored ``schema_version`` is newer than ``supported``.

    Checked on the raw stored value, before validation (so a newer object is refused as newer,
    not as invalid), and for every JSON type pydantic's lax mode would coerce to a number
    (``2``, ``2.0``, ``"2"``); anything else is left to validation.
    """
    if isinstance(version, bool):
        return
    number: float
    if isinstance(version, int | float):
        number = version
    elif isinstance(version, str):
        try:
            number = float(version)
        except ValueError:
            return
    else:
        return
    if number > supported:
        raise UnsupportedSchemaError(
            f"{what} has schema_version {version}; this reader knows {supported} at most "
            "(upgrade rollout-checkpoint)",
            schema_version=version,
            supported=supported,
        )


class InvalidRecordError(CheckpointError, ValueError):
    """A record or manifest that does not match its schema."""

    code = "invalid_record"


class InvalidArgumentError(CheckpointError, ValueError):
    """An argument of a public call is out of range or of the wrong type (not an identifier)."""

    code = "invalid_argument"


# --- storage ------------------------------------------------------------------------------


class StoreError(CheckpointError):
    """A storage operation failed permanently."""

    code = "store_error"


class TransientStoreError(StoreError):
    """A storage operation failed in a way that is worth retrying (timeouts, 5xx, 409)."""

    code = "store_transient"


class ObjectNotFoundError(StoreError, FileNotFoundError):
    """The object does not exist."""

    code = "not_found"


class ObjectExistsError(StoreError, FileExistsError):
    """A create-only put found a different object already at the key."""

    code = "already_exists"


class VersionChangedError(StoreError):
    """A compare-and-swap put found a version other than the expected one."""

    code = "version_changed"


class StorePermissionError(StoreError):
    """The store refused the operation: no permission, or a read-only file system."""

    code = "permission_denied"


class StoreUnreachableError(TransientStoreError):
    """The store could not be reached (connection refused, DNS, timeout): never "nothing stored".

    Transient by nature (a retry may succeed), so it is a :class:`TransientStoreError`."""

    code = "store_unreachable"


class NotAStoreError(StoreError):
    """A URL names a folder that holds checkpoint stores, not a store itself (``details.stores``)."""

    code = "not_a_store"


class StoreUnsupportedError(StoreError):
    """The backend does not implement the operation (a read-only fsspec filesystem, say)."""

    code = "unsupported_operation"


class ConditionalWriteUnsupportedError(StoreError):
    """The backend cannot prove atomic create-only / compare-and-swap puts; publication refused."""

    code = "conditional_writes_unsupported"


class IntegrityError(CheckpointError):
    """Stored bytes are missing, truncated or altered (digest or length mismatch)."""

    code = "integrity_error"


class ManifestConflictError(CheckpointError):
    """A different manifest was already committed at the same place."""

    code = "manifest_conflict"


class SequenceTakenError(ManifestConflictError):
    """Another publish already claimed this checkpoint sequence number (claim the next one)."""

    code = "sequence_taken"


class StoreOwnedError(CheckpointError):
    """The store belongs to another run's coordinator; take it over explicitly (``takeover``)."""

    code = "store_owned"


class StaleCoordinatorError(CheckpointError):
    """A newer owner epoch took the store over: this coordinator must not publish (it did not)."""

    code = "stale_coordinator"


# --- protocol -------------------------------------------------------------------------------


class StaleAttemptError(CheckpointError):
    """A request, write or retire came from an attempt that a restore has tombstoned."""

    code = "stale_attempt"


class IdentityConflictError(CheckpointError):
    """Two live attempts of one rollout at a participant, or a rollout re-dispatched twice."""

    code = "identity_conflict"


class UnknownExecutionError(CheckpointError, LookupError):
    """A call names an execution (or session, or model call) the participant does not track."""

    code = "unknown_execution"


class StaleCheckpointError(CheckpointError):
    """The checkpoint id was already resumed; it can never become active again."""

    code = "stale_checkpoint"


class CheckpointConflictError(CheckpointError):
    """A different checkpoint id is active at the participant."""

    code = "checkpoint_conflict"


class InvalidPhaseError(CheckpointError):
    """The operation is not allowed in the participant's current phase."""

    code = "invalid_phase"


class DeadlineExceededError(CheckpointError):
    """The operation's absolute deadline passed before it could finish."""

    code = "deadline_exceeded"


class DeadlineTooFarError(InvalidValueError):
    """A deadline further ahead than the participant accepts (its ``max_deadline_seconds``):
    nothing changed. A participant never holds admission closed on a client's say-so for longer."""

    code = "deadline_too_far"


class ParticipantRestartedError(CheckpointError):
    """A participant answered from another incarnation than the one the caller knew: it was
    restarted (its process replaced, its live state gone) without a restore in between, or
    within one cycle or one call. Nothing was published; recover (restore) before the next
    checkpoint. ``details``: ``participant``, ``expected`` and ``actual`` incarnations."""

    code = "participant_restarted"


class AdmissionClosedError(CheckpointError):
    """New work is refused while a checkpoint holds admission closed."""

    code = "admission_closed"


class GenerationCutError(CheckpointError):
    """A generation cut's acknowledgements do not cover the frozen call inventory exactly once,
    or their evidence disagrees (receipt, digest, identity): preparation fails.

    ``details["problem"]`` says which: ``missing``, ``duplicate``, ``unknown``, ``partial``,
    ``identity``, ``receipt_mismatch``, ``digest_mismatch``, ``missing_worker``, ``late``.
    """

    code = "generation_cut_invalid"


class CheckpointNotFoundError(CheckpointError):
    """No published checkpoint with that id (or none at all) exists under the URL."""

    code = "checkpoint_not_found"


class CheckpointRejectedError(CheckpointError):
    """The whole checkpoint must not be used: required state is missing, corrupt or unsafe."""

    code = "checkpoint_rejected"
