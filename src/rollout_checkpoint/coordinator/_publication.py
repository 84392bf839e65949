"""Publication: from committed component manifests to the global checkpoint record.

Shared by both publication modes. Every component manifest is validated (the digest its commit
reply names, the bytes, its identity, every shard and index digest), the registry component is
written and validated, then the aggregate manifest, the token-store snapshot (validated), and
last THE COMMIT POINT: the sequence claim and the global record, both create-only. Synchronous
publication runs this while the participants are paused; asynchronous publication runs it on a
background thread after the resume, from the frozen registry snapshot.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from functools import partial
from typing import Any

from pydantic import JsonValue

from ..errors import IntegrityError, ManifestConflictError, SequenceTakenError
from ..format import layout
from ..format.commit_log import iter_candidates, next_sequence, publish_record, write_aggregate
from ..format.manifests import (
    AggregateManifest,
    ComponentRef,
    GlobalCheckpointRecord,
    ObjectRef,
    new_commit_token,
)
from ..format.record_reader import ArchiveReader
from ..protocol import PREPARE_ORDER, CommitReply, ParticipantControl, Phase
from ..registry import REGISTRY_INSTANCE, REGISTRY_KIND, LiveExecutionRegistry
from ..store import ObjectStore
from ..telemetry import Attr, bound, log_fields
from ._core import CoordinatorCore, Steps, log
from ._types import receipt_json

__all__ = ["Publisher", "registry_snapshot"]

_SEQUENCE_ATTEMPTS = 32
_PIN_WORKERS = 8

Committed = list[tuple[str, ParticipantControl, CommitReply]]


def registry_snapshot(registry: LiveExecutionRegistry) -> LiveExecutionRegistry:
    """A private copy of the registry, taken atomically (under its lock) while dispatch is
    frozen: an asynchronous publication writes the registry component from it after the
    resume, whatever the framework does with the live registry meanwhile."""
    return registry.snapshot()


class PinChecks:
    """Format 2: the pins of every component of one checkpoint (its reference table, each base
    ``manifest.json`` against the SHA-256 that pins it), one request each, run concurrently in
    the background of steps 4 to 6; :meth:`join` waits for all of them before the commit point."""

    def __init__(self) -> None:
        # threads start on the first submit only (a version-1 checkpoint starts none)
        self._pool = ThreadPoolExecutor(max_workers=_PIN_WORKERS, thread_name_prefix="pins")
        self._futures: list[tuple[int, Future[None]]] = []

    def submit(self, order: int, checks: list[Callable[[], None]]) -> None:
        """Start ``checks`` of the component at position ``order`` (failures are raised in that
        order). Called from the validation threads: ``list.append`` is atomic."""
        for check in checks:
            self._futures.append((order, self._pool.submit(bound(check))))

    def join(self) -> None:
        """Every check has passed, or the first failure (component order) is raised."""
        failures = [(order, f.exception()) for order, f in self._futures if f.exception() is not None]
        if failures:
            error = min(failures, key=lambda failure: failure[0])[1]
            assert error is not None
            raise error

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> PinChecks:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Publisher(CoordinatorCore):
    """Steps 3 to 7 of the cycle (``docs/protocol.md``) and the checks they make."""

    def _complete(
        self,
        cid: str,
        deadline: float,
        hooked: ObjectStore,
        committed: Committed,
        registry: LiveExecutionRegistry,
        framework_state: JsonValue,
        steps: Steps,
        incarnations: dict[str, str],
    ) -> tuple[GlobalCheckpointRecord, ObjectRef]:
        """Steps 3 to 7; ``incarnations`` (the cycle's, ``kind/instance`` -> id) go into the
        record, so a later coordinator of this run compares with them."""
        # 3. validate every component manifest (digest named by the reply) and its bytes; the
        # components concurrently (a remote store answers slowly), the first failure in prepare
        # order raised, each error naming its component
        with PinChecks() as pins:
            with steps.step("validate"):
                for name, _, _ in committed:
                    self._step(f"validate:{name}")
                validated = self._fan_out(
                    [
                        (name, partial(self._validate, cid, p, reply, pins, order))
                        for order, (name, p, reply) in enumerate(committed)
                    ]
                )
                components: list[ComponentRef] = [ref for _, ref in validated]

            # 4. the framework's own component: the live-execution registry
            with steps.step("registry"):
                self._check_deadline(cid, deadline, "registry")
                _, registry_ref = registry.write_component(
                    hooked, cid, catalog=self.registry_catalog, **self.writer_options
                )
                self._step(f"validate:{REGISTRY_KIND}/{REGISTRY_INSTANCE}")
                components.append(
                    self._validate_ref(
                        cid,
                        REGISTRY_KIND,
                        REGISTRY_INSTANCE,
                        "framework",
                        None,
                        registry_ref,
                        pins,
                        len(committed),
                    )
                )

            # 5. aggregate manifest, create-only
            with steps.step("aggregate"):
                token = new_commit_token()
                created_at = datetime.fromtimestamp(self.clock(), tz=UTC)
                aggregate = AggregateManifest(
                    checkpoint_id=cid,
                    commit_token=token,
                    created_at=created_at,
                    prepare_order=list(PREPARE_ORDER),
                    components=components,
                    dispatched=len(registry),
                )
                aggregate_ref = write_aggregate(hooked, aggregate)

            # 6. token-store snapshot bound to this checkpoint id, validated before use
            with steps.step("tokens"):
                receipt: dict[str, JsonValue] | None = None
                if self.token_source is not None:
                    self._step("token_snapshot")
                    source = self.token_source
                    receipt = receipt_json(self._call("tokens", "snapshot", source.snapshot, cid, hook=False))
                    self._validate_snapshot(receipt)

            # 7. THE COMMIT POINT: sequence claim, then the global record (both create-only)
            with steps.step("publish") as published:
                pins.join()  # format 2: every pinned base checked (concurrently with steps 4 to 6)
                self._check_deadline(cid, deadline, "publish")
                self._step("publish")
                record, ref = self._publish(
                    cid,
                    token,
                    created_at,
                    aggregate_ref,
                    components,
                    receipt,
                    framework_state,
                    registry,
                    incarnations,
                )
                self._last_sequence = record.sequence
                published.set(Attr.SEQUENCE, record.sequence)
            return record, ref

    def _publish(
        self,
        cid: str,
        token: str,
        created_at: datetime,
        aggregate_ref: ObjectRef,
        components: list[ComponentRef],
        receipt: dict[str, JsonValue] | None,
        framework_state: JsonValue,
        registry: LiveExecutionRegistry,
        incarnations: dict[str, str],
    ) -> tuple[GlobalCheckpointRecord, ObjectRef]:
        """Claim the next sequence (derived from the published log, never from ``latest.json``)
        and create the record; a sequence another publisher won is retried one later."""
        owner = self._own()
        for _ in range(_SEQUENCE_ATTEMPTS):
            self._check_owner(owner)  # a newer epoch took the store over: publish nothing
            newest = next(iter_candidates(self.store), None)
            record = GlobalCheckpointRecord(
                checkpoint_id=cid,
                sequence=next_sequence(self.store, self._last_sequence),
                created_at=created_at,
                commit_token=token,
                coordinator_id=self.coordinator_id,
                previous_checkpoint_id=newest.checkpoint_id if newest is not None else None,
                aggregate=aggregate_ref,
                components=components,
                token_snapshot=receipt,
                framework_state=framework_state,
                counts=registry.counts(),
                run_id=owner.run_id,
                epoch=owner.epoch,
                incarnations=dict(sorted(incarnations.items())) or None,
            ).sealed()
            try:
                # the last ownership check runs between the claim and the record
                return record, publish_record(self.store, record, partial(self._check_owner, owner))
            except SequenceTakenError:
                log.info(
                    "checkpoint %s: sequence %d taken by another publisher",
                    cid,
                    record.sequence,
                    extra=log_fields(checkpoint_id=cid),
                )
        raise ManifestConflictError(
            f"checkpoint {cid}: lost the race for a sequence number {_SEQUENCE_ATTEMPTS} times in a row",
            checkpoint_id=cid,
        )

    def _validate(
        self, cid: str, participant: ParticipantControl, reply: CommitReply, pins: PinChecks, order: int
    ) -> ComponentRef:
        caps = participant.capabilities()
        if (reply.checkpoint_id, reply.kind, reply.instance) != (cid, caps.kind, caps.instance):
            raise IntegrityError(
                f"commit reply of {caps.kind}/{caps.instance} names {reply.kind}/{reply.instance} "
                f"of checkpoint {reply.checkpoint_id}",
                checkpoint_id=cid,
            )
        if (
            reply.phase is not Phase.COMMITTED
            or reply.manifest_key is None
            or reply.manifest_sha256 is None
            or reply.manifest_bytes is None
        ):
            raise IntegrityError(
                f"{caps.kind}/{caps.instance}: the reply of checkpoint {cid} is {reply.phase.value}, "
                "not committed",
                checkpoint_id=cid,
            )
        ref = ObjectRef(key=reply.manifest_key, sha256=reply.manifest_sha256, bytes=reply.manifest_bytes)
        return self._validate_ref(cid, caps.kind, caps.instance, "participant", caps.mode, ref, pins, order)

    def _validate_ref(
        self,
        cid: str,
        kind: str,
        instance: str,
        role: str,
        mode: str | None,
        ref: Any,
        pins: PinChecks,
        order: int,
    ) -> ComponentRef:
        prefix = layout.component_prefix(cid, kind, instance)
        if ref.key != f"{prefix}/{layout.MANIFEST_NAME}":
            raise IntegrityError(f"{kind}/{instance}: manifest {ref.key} is not at {prefix}", key=ref.key)
        reader = ArchiveReader.open(self.store, prefix, expected_sha256=ref.sha256)
        if reader.manifest_ref.bytes != ref.bytes:
            raise IntegrityError(
                f"{ref.key}: {reader.manifest_ref.bytes} bytes, expected {ref.bytes}", key=ref.key
            )
        manifest = reader.manifest
        if (manifest.checkpoint_id, manifest.participant_kind, manifest.instance) != (cid, kind, instance):
            raise IntegrityError(f"{ref.key}: manifest names another component", key=ref.key)
        problems = reader.check_stored()  # the objects this archive wrote: shards and index
        if problems:
            raise problems[0]
        # format 2: the reference table and every base manifest it points into, each against its
        # pin, one request each, concurrently with what follows (joined before the commit point;
        # the bases' own shards were checked when their own checkpoint was published)
        pins.submit(order, reader.pin_checks())
        return ComponentRef(
            kind=kind,
            instance=instance,
            role="participant" if role == "participant" else "framework",
            mode=mode,
            prefix=prefix,
            manifest=ObjectRef(key=ref.key, sha256=ref.sha256, bytes=ref.bytes),
        )

    def _validate_snapshot(self, receipt: dict[str, JsonValue]) -> None:
        if self.token_snapshot_loader is not None:
            self.token_snapshot_loader(self.store, receipt)
            return
        from ..reader import default_token_snapshot_loader

        default_token_snapshot_loader(self.store, receipt)
