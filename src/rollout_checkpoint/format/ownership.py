"""Coordinator fencing at the store: one run owns a store, one coordinator of it publishes.

A coordinator takes an **epoch** before its first checkpoint or restore: the next free
``owner/<epoch:020d>.json``, created create-only (of two coordinators racing for one epoch exactly
one wins). The epoch object names the run (``run_id``), the coordinator and
``published_through``, the highest sequence whose record existed when the epoch was taken.

* A store whose newest epoch belongs to another run is refused (``store_owned``, naming the
  owner) unless the coordinator takes it over explicitly (``takeover=True``).
* Every global record carries ``run_id`` and ``epoch``. A coordinator checks, before it claims a
  sequence and again just before it writes the record, that no newer epoch exists
  (``stale_coordinator``: nothing is published).
* The check and the record put are two requests, so readers close the window between them: a
  record of epoch ``e`` whose sequence is above ``published_through`` of a later epoch was
  published after that epoch took the store over; it is passed over, never used.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import IntegrityError, ObjectExistsError, StaleCoordinatorError, StoreOwnedError
from ..ids import Identifier
from ..store import ObjectStore
from .manifests import GlobalCheckpointRecord, canonical_json

__all__ = [
    "OWNER_PREFIX",
    "OwnerEpoch",
    "check_epoch",
    "current_epoch",
    "owner_key",
    "read_epochs",
    "stale_reason",
    "take_epoch",
]

OWNER_PREFIX = "owner"
_ATTEMPTS = 32


class OwnerEpoch(BaseModel):
    """``owner/<epoch>.json``: who owns the store from this epoch on."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    schema_version: Literal[1] = 1
    type: Literal["owner_epoch"] = "owner_epoch"
    epoch: int = Field(ge=1)
    run_id: Identifier
    coordinator_id: str = Field(min_length=1)
    created_at: datetime
    published_through: int = Field(ge=0)
    took_over_from: Identifier | None = None

    def to_bytes(self) -> bytes:
        return canonical_json(self.model_dump(mode="json"))


def owner_key(epoch: int) -> str:
    return f"{OWNER_PREFIX}/{epoch:020d}.json"


def read_epochs(store: ObjectStore) -> list[OwnerEpoch]:
    """Every epoch, oldest first. An object that does not parse is an ``IntegrityError``
    (ownership is never guessed)."""
    epochs: list[OwnerEpoch] = []
    for info in store.list(OWNER_PREFIX + "/"):
        name = info.key.rsplit("/", 1)[-1]
        if not (name.endswith(".json") and name[:-5].isdigit()):
            continue
        data = store.get(info.key)
        try:
            epoch = OwnerEpoch.model_validate_json(data)
        except ValidationError as exc:
            raise IntegrityError(
                f"{store.url}: {info.key} is not an owner epoch: {exc}", key=info.key
            ) from None
        if owner_key(epoch.epoch) != info.key:
            raise IntegrityError(f"{store.url}: {info.key} names epoch {epoch.epoch}", key=info.key)
        epochs.append(epoch)
    return sorted(epochs, key=lambda e: e.epoch)


def current_epoch(store: ObjectStore) -> OwnerEpoch | None:
    epochs = read_epochs(store)
    return epochs[-1] if epochs else None


def take_epoch(
    store: ObjectStore,
    *,
    run_id: str,
    coordinator_id: str,
    created_at: datetime,
    published_through: int,
    takeover: bool = False,
) -> OwnerEpoch:
    """Create the next epoch for ``run_id`` (create-only). Refuses a store owned by another run
    unless ``takeover``; a race for one epoch is lost by all but one and re-decided."""
    for _ in range(_ATTEMPTS):
        current = current_epoch(store)
        if current is not None and current.run_id != run_id and not takeover:
            raise StoreOwnedError(
                f"{store.url} is owned by run {current.run_id!r} (epoch {current.epoch}, coordinator "
                f"{current.coordinator_id}); pass takeover=True (CLI --takeover) to take it over",
                owner=current.run_id,
                epoch=current.epoch,
            )
        epoch = OwnerEpoch(
            epoch=1 if current is None else current.epoch + 1,
            run_id=run_id,
            coordinator_id=coordinator_id,
            created_at=created_at,
            published_through=published_through,
            took_over_from=None if current is None or current.run_id == run_id else current.run_id,
        )
        try:
            store.put_if_absent(owner_key(epoch.epoch), epoch.to_bytes())
        except ObjectExistsError:
            continue  # another coordinator took this epoch first: decide again
        return epoch
    raise StaleCoordinatorError(f"{store.url}: lost the race for an epoch {_ATTEMPTS} times in a row")


def check_epoch(store: ObjectStore, mine: OwnerEpoch) -> None:
    """Raise :class:`StaleCoordinatorError` when a newer epoch than ``mine`` exists."""
    current = current_epoch(store)
    if current is not None and current.epoch > mine.epoch:
        raise StaleCoordinatorError(
            f"{store.url}: epoch {current.epoch} (run {current.run_id!r}, coordinator "
            f"{current.coordinator_id}) took the store over from this coordinator (epoch {mine.epoch}); "
            "nothing was published",
            epoch=mine.epoch,
            current_epoch=current.epoch,
            owner=current.run_id,
        )


def stale_reason(record: GlobalCheckpointRecord, epochs: list[OwnerEpoch]) -> str | None:
    """Why a reader must pass ``record`` over (published by a coordinator fenced before it
    published), or ``None``. A record without an epoch (written before fencing existed) counts
    as epoch 0."""
    mine = record.epoch or 0
    for later in epochs:
        if later.epoch > mine and record.sequence > later.published_through:
            return (
                f"{record.checkpoint_id} (sequence {record.sequence}, epoch {mine}) was published after "
                f"epoch {later.epoch} of run {later.run_id!r} took the store over at sequence "
                f"{later.published_through}: a fenced coordinator's publication, never used"
            )
    return None
