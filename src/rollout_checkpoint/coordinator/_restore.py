"""Restore orchestration, explicit resume, retire and forget.

A restore (like a checkpoint) waits for a pending asynchronous publication first, so it restores
from the newest checkpoint that exists once that publication ended; ``forget`` waits for it too
(its token snapshot must still list the forgotten rollouts); ``retire`` does not wait.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from functools import partial

from ..errors import CheckpointError, InvalidPhaseError
from ..format.manifests import new_checkpoint_id
from ..ids import ExecutionId, validate_id
from ..protocol import PREPARE_ORDER, ParticipantControl, ResumeReply
from ..reader import load_checkpoint
from ..telemetry import Attr, Span, instruments, log_fields, operation
from ._core import log
from ._cycle import CheckpointCycle
from ._types import RETIRE_ORDER, MissingParticipantError, RestoreFailedError, RestoreOutcome

__all__ = ["RestoreOperations"]


class RestoreOperations(CheckpointCycle):
    """``restore`` / ``resume`` / ``retire`` / ``forget``."""

    # -- restore ---------------------------------------------------------------------------------
    def restore(
        self,
        checkpoint_id: str | None = None,
        *,
        deadline_s: float = 60.0,
        restore_id: str | None = None,
        verify: bool = True,
        fallback: bool = False,
    ) -> RestoreOutcome:
        """Restore a published checkpoint (latest by default) into the participants.

        All-or-nothing: the checkpoint is loaded and classified first (a rejected checkpoint
        touches nothing); then every participant restores the ``continue`` executions as attempt
        N+1 under a new ``restore_id``. If anything fails, the restore is undone at every
        participant it reached (``abort_restore``: each puts back what it installed), the
        registry is left unchanged and :class:`RestoreFailedError` is raised: nothing changed.
        On success the registry holds the rebuilt plan and the participants stay paused until
        :meth:`resume` ``(restore_id)``. ``verify`` / ``fallback`` are those of
        :func:`~rollout_checkpoint.reader.load_checkpoint`: by default every byte the restore
        installs and every token row a continuing rollout depends on is digest-checked first
        (``verify=False``, the cheap plan, skips that and says so in ``plan.notes``);
        ``fallback`` uses the newest checkpoint that loads (verifies) when the requested one is
        damaged (``outcome.plan.skipped`` says what was passed over).
        """
        self.store.require_atomic_commits(accept_risk=self.accept_unsafe_store)
        with self._cycle, operation(Span.coordinator("restore")) as restoring:
            # the epoch first: a record a fenced coordinator still lands after it is passed over;
            # and a fenced coordinator restores nothing either
            self._check_owner(self._own())
            plan = load_checkpoint(
                self.store,
                checkpoint_id,
                verify=verify,
                fallback=fallback,
                token_snapshot_loader=self.token_snapshot_loader,
            )
            rid = validate_id(restore_id or new_checkpoint_id("restore"), "restore_id")
            restoring.set(Attr.CHECKPOINT_ID, rid)
            restoring.set(Attr.SOURCE_CHECKPOINT_ID, plan.checkpoint_id)
            listed = sorted(f"{c.kind}/{c.instance}" for c in plan.participant_components())
            missing = [name for name in listed if name not in self._names]
            if missing:
                self._refused[rid] = (plan.checkpoint_id, missing)
                raise self._missing(rid, plan.checkpoint_id, missing)
            entries, retired = plan.registry_entries()
            if self.registry.frozen_by is not None:
                raise InvalidPhaseError(f"restore: checkpoint {self.registry.frozen_by} holds the registry")
            deadline = self.clock() + deadline_s
            continued = [p.execution for p in plan.continued]
            fresh = [p.execution for p in plan.fresh]
            ordered = self._ordered()
            touched: list[tuple[str, ParticipantControl]] = []
            restored: dict[str, tuple[ExecutionId, ...]] = {}
            incarnations: dict[str, str] = {}  # kept once the restore succeeded everywhere
            try:
                for kind in PREPARE_ORDER:
                    group = [(n, p) for n, p in ordered if n.split("/", 1)[0] == kind]
                    touched.extend(group)
                    for name, reply in self._fan_out(
                        [
                            (
                                name,
                                partial(
                                    self._call,
                                    name,
                                    "restore",
                                    participant.restore,
                                    rid,
                                    plan.checkpoint_id,
                                    self.store,
                                    deadline,
                                    continued,
                                ),
                            )
                            for name, participant in group
                        ]
                    ):
                        restored[name] = tuple(reply.restored)
                        incarnations[name] = reply.incarnation
                # Fence attempt N of every non-completed rollout at every participant that did not
                # restore it (a restoring participant fenced its own), so a late request from N
                # is refused everywhere.
                for stage in RETIRE_ORDER:
                    for name, participant in ordered:
                        if name.split("/", 1)[0] not in stage:
                            continue
                        mine = {e.rollout_id for e in restored.get(name, ())}
                        batch = fresh + [e for e in continued if e.rollout_id not in mine]
                        if batch:
                            self._call(name, "retire", participant.retire, batch, deadline)
                self.registry.install(entries, retired)
            except BaseException as exc:
                self._undo_restore(rid, touched, deadline)
                if isinstance(exc, CheckpointError):
                    raise RestoreFailedError(
                        f"restore {rid} of {plan.checkpoint_id} failed and was undone (participants and "
                        f"registry are as they were): {exc.message}",
                        restore_id=rid,
                        checkpoint_id=plan.checkpoint_id,
                        cause=exc.code,
                    ) from exc
                raise
            # the restored state lives in these incarnations: the next checkpoint compares with them
            self._keep(incarnations)
            for disposition, count in plan.counts().items():
                instruments().rollouts.add(count, {Attr.ROLLOUT_DISPOSITION: disposition})
            return RestoreOutcome(rid, plan.checkpoint_id, plan, restored)

    def _undo_restore(
        self, rid: str, touched: Sequence[tuple[str, ParticipantControl]], deadline: float
    ) -> None:
        """Undo the restore at every participant it reached, last stage first; never raises.

        Each participant drops what it installed and puts its tombstones back; one that refused
        (or never saw ``rid``) only fences the id. A call that failed may have been applied with
        its answer lost, so it is undone too. One that cannot be reached reopens by lease expiry.
        """
        cleanup = max(deadline, self.clock() + self.cleanup_grace_s)
        for name, participant in reversed(touched):
            for attempt in range(self.call_retries + 1):
                try:
                    participant.abort_restore(rid, cleanup)
                    break
                except Exception as exc:
                    if attempt >= self.call_retries:
                        log.warning(
                            "restore %s: undoing it at %s failed: %s",
                            rid,
                            name,
                            exc,
                            extra=log_fields(checkpoint_id=rid, participant=name),
                        )

    def _missing(self, rid: str, source: str, missing: Sequence[str]) -> MissingParticipantError:
        return MissingParticipantError(
            f"restore {rid} of {source} refused: the checkpoint lists participant(s) "
            f"{', '.join(missing)}, which this coordinator does not have; nothing was restored "
            "or resumed",
            restore_id=rid,
            checkpoint_id=source,
            missing=list(missing),
        )

    def resume(self, checkpoint_id: str, *, deadline_s: float = 30.0) -> list[ResumeReply]:
        """Resume every participant (reverse prepare order): ends a restore's pause.

        A restore refused for a missing participant cannot be resumed either
        (:class:`MissingParticipantError`): nothing of it may run.
        """
        with operation(Span.coordinator("resume"), attributes={Attr.CHECKPOINT_ID: checkpoint_id}):
            refused = self._refused.get(checkpoint_id)
            if refused is not None:
                raise self._missing(checkpoint_id, *refused)
            deadline = self.clock() + deadline_s
            replies: list[ResumeReply] = []
            for name, participant in reversed(self._ordered()):
                replies.append(
                    self._call(name, "resume", participant.resume, checkpoint_id, deadline, hook=False)
                )
            return replies

    # -- retire / forget ---------------------------------------------------------------------------
    def retire(self, executions: Iterable[ExecutionId], *, deadline_s: float = 30.0) -> None:
        """Retire attempts everywhere (callers before callees, :data:`RETIRE_ORDER`) and in the
        registry (where they are still live there)."""
        batch = list(executions)
        if not batch:
            return
        with operation(Span.coordinator("retire"), attributes={Attr.EXECUTIONS: len(batch)}):
            self._retire_everywhere(batch, deadline_s)

    def _retire_everywhere(self, batch: list[ExecutionId], deadline_s: float) -> None:
        deadline = self.clock() + deadline_s
        ordered = self._ordered()
        for stage in RETIRE_ORDER:
            self._fan_out(
                [
                    (
                        name,
                        partial(self._call, name, "retire", participant.retire, batch, deadline, hook=False),
                    )
                    for name, participant in ordered
                    if name.split("/", 1)[0] in stage
                ]
            )
        for execution in batch:
            with contextlib.suppress(CheckpointError):
                self.registry.retire(execution)

    def forget(self, rollout_ids: Iterable[str]) -> None:
        """The framework is done with these rollouts for good: drop tombstones everywhere, and
        their token data from later token-store snapshots (if the token source can forget)."""
        ids = list(rollout_ids)
        with operation(Span.coordinator("forget"), attributes={Attr.ROLLOUT_COUNT: len(ids)}):
            self._forget_everywhere(ids)

    def _forget_everywhere(self, ids: list[str]) -> None:
        # The token snapshot of a pending asynchronous publication must still list these
        # rollouts' token data, so forgetting waits for it (retire needs no wait: every
        # snapshot it could change is frozen).
        self.wait_until_finished()
        ordered = self._ordered()
        for stage in RETIRE_ORDER:
            for name, participant in ordered:
                if name.split("/", 1)[0] in stage:
                    self._call(name, "forget", participant.forget, ids, hook=False)
        self.registry.forget(ids)
        forget_tokens = getattr(self.token_source, "forget", None)
        if callable(forget_tokens):  # later snapshots leave their token data out: gc can drop it
            forget_tokens(ids)
