"""The framework's live-execution registry: every dispatched attempt and where it stands.

Recovery needs one fact no participant can supply: whether the framework durably accepted a
rollout's result before the checkpoint. The registry records it, goes into every checkpoint as
the ``framework/registry`` component, and is rebuilt from the recovery plan on restore.

States: ``queued -> running -> finished -> handed_off -> consumed``. ``handed_off`` means the
result was durably acknowledged (its :class:`CompletedResultRecord` is kept until consumed);
a checkpoint then classifies the rollout ``completed`` and never resumes it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import JsonValue

from ..errors import AdmissionClosedError, IdentityConflictError, InvalidPhaseError, StaleAttemptError
from ..format import layout
from ..format.records import CompletedResultRecord, DispatchState
from ..ids import ExecutionId, validate_id
from ..store import ObjectStore

if TYPE_CHECKING:
    from ..archive import ComponentManifest, ManifestRef
    from ..protocol._increments import BaseCatalog
from ._entries import (
    _LIVE,
    REGISTRY_INSTANCE,
    REGISTRY_KIND,
    ExecutionInfo,
    RegistryEntry,
    _Entry,
    registry_batches,
    result_payload,
)

__all__ = ["LiveExecutionRegistry"]


class LiveExecutionRegistry:
    """Thread-safe registry of the current attempt of every dispatched rollout.

    One entry per rollout (its current attempt); earlier attempts are tombstoned here too, so a
    late report from a replaced attempt gets :class:`StaleAttemptError`. While a checkpoint
    holds the registry frozen, :meth:`dispatch` refuses new work (the membership the
    participants prepare must not change under them); state changes of existing entries go on.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._entries: dict[str, _Entry] = {}
        self._retired: dict[str, int] = {}
        self._frozen_by: str | None = None
        # Copy on write after a snapshot (see ``snapshot``): the rollouts whose entry object is
        # this registry's own since the last snapshot; ``None``: no entry is shared.
        self._owned: set[str] | None = None

    # -- dispatch ----------------------------------------------------------------------------
    def dispatch(
        self, rollout_id: str, *, input_digest: str | None = None, restart_only: bool = False
    ) -> ExecutionId:
        """Register a new attempt of ``rollout_id`` as ``queued``: attempt 0, or the next one
        after a retired attempt. A rollout with an attempt still live (or a result not yet
        consumed) is refused with :class:`IdentityConflictError`."""
        validate_id(rollout_id, "rollout_id")
        with self._lock:
            self._check_open()
            current = self._entries.get(rollout_id)
            if current is not None:
                raise IdentityConflictError(
                    f"rollout {rollout_id!r} already has attempt {current.attempt} ({current.state}); "
                    "retire it before dispatching another attempt",
                    rollout_id=rollout_id,
                    attempt=current.attempt,
                    state=current.state,
                )
            retired = self._retired.get(rollout_id)
            attempt = 0 if retired is None else retired + 1
            self._entries[rollout_id] = _Entry(rollout_id, attempt, "queued", input_digest, restart_only)
            if self._owned is not None:
                self._owned.add(rollout_id)
            return ExecutionId(rollout_id=rollout_id, attempt=attempt)

    def redispatch(self, execution: ExecutionId) -> ExecutionId:
        """Retire ``execution`` and queue attempt N+1 from the same original input."""
        with self._lock:
            self._check_open()
            entry = self._current(execution)
            if entry.state not in _LIVE:
                raise InvalidPhaseError(
                    f"{execution} is {entry.state}: its result is accepted, it is not re-dispatched",
                    state=entry.state,
                )
            self._retire_locked(entry)
            return self.dispatch(
                execution.rollout_id, input_digest=entry.input_digest, restart_only=entry.restart_only
            )

    # -- state changes ------------------------------------------------------------------------
    def start(self, execution: ExecutionId) -> None:
        """``queued -> running``."""
        self._advance(execution, "queued", "running")

    def finish(self, execution: ExecutionId) -> None:
        """``running -> finished``: the result exists but the framework has not accepted it."""
        self._advance(execution, "running", "finished")

    def hand_off(
        self, execution: ExecutionId, result: JsonValue = None, *, reward: float | None = None
    ) -> CompletedResultRecord:
        """``finished -> handed_off``: call once the result is durably acknowledged.

        From the next checkpoint on the rollout is ``completed`` and never resumed.
        """
        record = CompletedResultRecord(
            rollout_id=execution.rollout_id,
            attempt=execution.attempt,
            result=result,
            reward=reward,
            acknowledged=True,
        )
        payload = result_payload(record)  # encoded here, not inside a checkpoint's pause
        with self._lock:
            entry = self._current(execution)
            self._require(entry, "finished", "handed_off")
            entry = self._own(entry)
            entry.state = "handed_off"
            entry.set_result(record, payload)
        return record

    def consume(self, execution: ExecutionId) -> CompletedResultRecord:
        """``handed_off -> consumed``: the trainer used the result; it is dropped from memory."""
        with self._lock:
            entry = self._current(execution)
            self._require(entry, "handed_off", "consumed")
            assert entry.result is not None
            result = entry.result
            entry = self._own(entry)
            entry.state = "consumed"
            entry.set_result(None, None)
            return result

    def retire(self, execution: ExecutionId) -> None:
        """Drop a live attempt: reports from it become stale; :meth:`dispatch` gives attempt N+1."""
        with self._lock:
            entry = self._current(execution)
            if entry.state not in _LIVE:
                raise InvalidPhaseError(
                    f"{execution} is {entry.state}; only queued, running or finished attempts retire",
                    state=entry.state,
                )
            self._retire_locked(entry)

    def forget(self, rollout_ids: Iterable[str]) -> None:
        """Forget rollouts for good (entry and tombstone); a later dispatch starts at attempt 0."""
        with self._lock:
            for rollout_id in rollout_ids:
                self._entries.pop(rollout_id, None)
                self._retired.pop(rollout_id, None)

    # -- checkpoint hooks --------------------------------------------------------------------------
    @contextlib.contextmanager
    def frozen(self, checkpoint_id: str) -> Iterator[list[ExecutionId]]:
        """Freeze dispatch membership for one checkpoint; yields the frozen live executions."""
        with self._lock:
            if self._frozen_by is not None:
                raise AdmissionClosedError(
                    f"dispatch is already frozen by checkpoint {self._frozen_by!r}",
                    checkpoint_id=self._frozen_by,
                )
            self._frozen_by = checkpoint_id
            live = [e.execution() for e in self._entries.values() if e.state in _LIVE]
        try:
            yield live
        finally:
            with self._lock:
                self._frozen_by = None

    @property
    def frozen_by(self) -> str | None:
        return self._frozen_by

    # -- reading ---------------------------------------------------------------------------------
    def get(self, rollout_id: str) -> ExecutionInfo:
        with self._lock:
            entry = self._entries.get(rollout_id)
            if entry is None:
                raise KeyError(rollout_id)
            return entry.info()

    def __contains__(self, rollout_id: object) -> bool:
        with self._lock:
            return rollout_id in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def executions(self, states: Iterable[str] | None = None) -> list[ExecutionInfo]:
        """Entries (optionally only those in ``states``), sorted by rollout id."""
        wanted = None if states is None else frozenset(states)
        with self._lock:
            return [e.info() for _, e in sorted(self._entries.items()) if wanted is None or e.state in wanted]

    def pending_results(self) -> list[CompletedResultRecord]:
        """Acknowledged results not consumed yet (kept across checkpoints and restores)."""
        with self._lock:
            return [e.result for _, e in sorted(self._entries.items()) if e.result is not None]

    def counts(self) -> dict[str, int]:
        with self._lock:
            out: dict[str, int] = {}
            for entry in self._entries.values():
                out[entry.state] = out.get(entry.state, 0) + 1
            return dict(sorted(out.items()))

    def retired(self) -> dict[str, int]:
        """``rollout_id -> highest retired attempt``."""
        with self._lock:
            return dict(sorted(self._retired.items()))

    def check(self, execution: ExecutionId) -> None:
        """Raise unless ``execution`` is the current attempt of its rollout."""
        with self._lock:
            self._current(execution)

    # -- persistence -------------------------------------------------------------------------------
    def write_component(
        self,
        store: ObjectStore,
        checkpoint_id: str,
        *,
        catalog: BaseCatalog | None = None,
        **writer_options: Any,
    ) -> tuple[ComponentManifest, ManifestRef]:
        """Write the registry as the ``framework/registry`` component archive of ``checkpoint_id``.

        One ``dispatch`` member per entry and one ``completed_result`` member per retained
        result, as two columnar batches (``ArchiveWriter.write_columns``): payloads are orjson
        of the record models' JSON shape, built in bulk from the entries (validated when they
        were made); :func:`records.decode_record` reads them back as the record models. With a
        ``catalog`` (format 2) members unchanged since its published archive are referred to.
        """
        from ..archive import ArchiveWriter
        from ..protocol._increments import IncrementalPlan

        with self._lock:  # the entries go on changing: their columns are taken under the lock
            entries = [e for _, e in sorted(self._entries.items())]
            batches = registry_batches(entries)
            counts: dict[str, int] = {}
            for entry in entries:
                counts[entry.state] = counts.get(entry.state, 0) + 1
            retired = dict(sorted(self._retired.items()))
        writer = ArchiveWriter(
            store,
            layout.component_prefix(checkpoint_id, REGISTRY_KIND, REGISTRY_INSTANCE),
            checkpoint_id=checkpoint_id,
            participant_kind=REGISTRY_KIND,
            instance=REGISTRY_INSTANCE,
            **writer_options,
        )
        plan = catalog.plan(store) if catalog is not None else IncrementalPlan(None)
        try:
            for batch in batches:
                part = plan.split_batch(batch)
                if part is not None:
                    part.write_to(writer)
            plan.apply(writer)
            extra: dict[str, JsonValue] = {
                "retired": dict(retired.items()),
                "counts": dict(counts.items()),
            }
            manifest = writer.commit(extra=extra)
        except BaseException:
            with contextlib.suppress(Exception):
                writer.abort()
            raise
        if catalog is not None:
            catalog.committed(store, writer.prefix, checkpoint_id, plan)
        return manifest, writer.manifest_ref

    def snapshot(self) -> LiveExecutionRegistry:
        """A private copy taken atomically (an asynchronous publication writes the registry
        component from it after the resume). Copy on write: the copy shares this registry's
        entry objects (a C-level copy of the mapping, inside the pause), and this registry
        clones an entry before it first changes it after the snapshot (``_own``), so the copy
        never sees a later change. The copy is read only (it is written out, never changed)."""
        copy = LiveExecutionRegistry()
        with self._lock:
            copy._entries = dict(self._entries)
            copy._retired = dict(self._retired)
            self._owned = set()  # every entry is shared now
        copy._owned = set()  # the copy's entries are shared too: a change to it clones first
        return copy

    def _own(self, entry: _Entry) -> _Entry:
        """``entry`` as this registry's own object, cloned (and put in its place) first if a
        snapshot may share it. Lock held; every change of an existing entry goes through it."""
        owned = self._owned
        if owned is None or entry.rollout_id in owned:
            return entry
        twin = entry.clone()
        self._entries[entry.rollout_id] = twin
        owned.add(entry.rollout_id)
        return twin

    def install(self, entries: Iterable[RegistryEntry], retired: Mapping[str, int] | None = None) -> None:
        """Replace the whole content (restore uses it); validated completely before installing."""
        staged: dict[str, _Entry] = {}
        for item in entries:
            validate_id(item.rollout_id, "rollout_id")
            if item.rollout_id in staged:
                raise IdentityConflictError(
                    f"rollout {item.rollout_id!r} appears twice", rollout_id=item.rollout_id
                )
            if item.state == "handed_off" and item.result is None:
                raise InvalidPhaseError(f"{item.rollout_id}: handed_off entry without its result")
            staged[item.rollout_id] = _Entry(
                item.rollout_id,
                item.attempt,
                item.state,
                item.input_digest,
                item.restart_only,
                item.result if item.state == "handed_off" else None,
                encode=False,  # encoded on first use: a restore or a copy stays cheap
            )
        marks = dict(retired or {})
        with self._lock:
            self._check_open()
            self._entries = staged
            self._owned = None  # new entry objects: none is shared
            self._retired = marks

    # -- internals ----------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._frozen_by is not None:
            raise AdmissionClosedError(
                f"dispatch membership is frozen by checkpoint {self._frozen_by!r}; retry after it resumes",
                checkpoint_id=self._frozen_by,
            )

    def _current(self, execution: ExecutionId) -> _Entry:
        entry = self._entries.get(execution.rollout_id)
        retired = self._retired.get(execution.rollout_id)
        if retired is not None and execution.attempt <= retired:
            raise StaleAttemptError(
                f"attempt {execution.attempt} of {execution.rollout_id!r} is retired",
                rollout_id=execution.rollout_id,
                attempt=execution.attempt,
                retired_through=retired,
            )
        if entry is None or entry.attempt != execution.attempt:
            raise IdentityConflictError(
                f"{execution} is not the current attempt of its rollout"
                + ("" if entry is None else f" (attempt {entry.attempt} is)"),
                rollout_id=execution.rollout_id,
                attempt=execution.attempt,
            )
        return entry

    @staticmethod
    def _require(entry: _Entry, state: str, target: str) -> None:
        if entry.state != state:
            raise InvalidPhaseError(
                f"{entry.rollout_id}#{entry.attempt} is {entry.state}; {target} needs {state}",
                state=entry.state,
            )

    def _advance(self, execution: ExecutionId, state: DispatchState, target: DispatchState) -> None:
        with self._lock:
            entry = self._current(execution)
            self._require(entry, state, target)
            self._own(entry).state = target

    def _retire_locked(self, entry: _Entry) -> None:
        del self._entries[entry.rollout_id]
        mark = self._retired.get(entry.rollout_id, -1)
        self._retired[entry.rollout_id] = max(mark, entry.attempt)
