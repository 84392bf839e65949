"""The checkpoint side of a checkpointed Gym rollout collection (:mod:`.collect`): the
:class:`CollectionController` (registry ledger, coordinator, write gate, checkpoint thread,
signals) and the wrappers that put it between Gym's collector and its servers
(:class:`_TrackingClient`, :class:`_GatedCompletions`)."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from nemo_gym.rollout_collection import RolloutCollectionConfig

from ...coordinator import Coordinator
from ...errors import CheckpointError, InvalidArgumentError
from ...ids import ExecutionId
from ...reader import load_checkpoint
from ...registry import LiveExecutionRegistry
from ...server import RemoteParticipant
from ...tokens import ObjectStoreTokenStore
from ._collect_ledger import ROLLOUT_ID_KEY, CollectionLedger, row_rollout_id
from ._collect_settings import SECTION, CollectSettings, server_urls

__all__ = ["CollectionController"]

log = logging.getLogger("rollout_checkpoint.integrations.nemo_gym.collect")

_WAIT_S = 0.02
_WATCH_S = 1.0
"""Seconds between the checks that every participant still answers as the same incarnation."""
_LOST_AFTER = 5


def _say(message: str) -> None:
    print(f"rollout-checkpoint: {message}", flush=True)


class _TrackingClient:
    """Gym's server client; each ``/run`` is dispatched and started in the registry before it is
    sent and finished when it answers 200."""

    def __init__(self, inner: Any, collector: CollectionController) -> None:
        self._inner = inner
        self._collector = collector

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def post(self, server_name: str, url_path: str, **kwargs: Any) -> Any:
        body = kwargs.get("json")
        if url_path != "/run" or not isinstance(body, Mapping) or ROLLOUT_ID_KEY not in body:
            return await self._inner.post(server_name=server_name, url_path=url_path, **kwargs)
        ledger = self._collector.ledger
        # a checkpoint holds dispatch frozen; after a SIGTERM checkpoint nothing more is sent
        while self._collector.halted or ledger.started(body) is None:
            await asyncio.sleep(_WAIT_S)
        response = await self._inner.post(server_name=server_name, url_path=url_path, **kwargs)
        if getattr(response, "status", None) == 200:
            ledger.finished(body)
            return response
        # a failed /run may be a server that died under it: give the watch time to tell; if it
        # ends the run (exit 75, the re-run resumes) this row is not handed to Gym as a failure
        end = time.monotonic() + _LOST_AFTER * _WATCH_S + 2.0
        while time.monotonic() < end and not self._collector.is_halted():
            await asyncio.sleep(0.1)
        while self._collector.is_halted():
            await asyncio.sleep(_WAIT_S)
        return response


class _GatedCompletions:
    """Gym's completion iterator; while a checkpoint runs no finished row goes on to be written,
    and the rows Gym wrote are handed off before it asks for the next one."""

    def __init__(self, inner: Any, collector: CollectionController) -> None:
        self._inner = inner
        self._collector = collector

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        self._collector.row_written()
        return self._gate(next(self._inner))

    async def _gate(self, future: Any) -> Any:
        completed = await future
        await self._collector.enter_write()
        return completed

    async def aclose(self) -> None:
        close = getattr(self._inner, "aclose", None)
        if close is not None:
            await close()


class CollectionController:
    """The checkpoint side of one collection: registry ledger, coordinator, write gate, the
    checkpoint thread and the signals (plain state; Gym's helper is a pydantic model)."""

    def __init__(self, settings: CollectSettings | None, global_config: Mapping[str, Any]) -> None:
        self.settings = settings
        self.global_config = dict(global_config)
        self._lock = threading.Lock()
        self._checkpointing = False
        self._writing = False
        self._wake = threading.Event()
        self._reasons: list[str] = []
        self._stop = threading.Event()
        self.preempted = False
        self.exit_note = ""
        self.halted = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task[Any] | None = None
        self.inner_iterators: list[Any] = []
        self.published: list[str] = []
        self._misses: dict[str, int] = {}
        self.ledger: CollectionLedger
        self.coordinator: Coordinator

    def is_halted(self) -> bool:
        """Nothing more is sent or written (after SIGTERM, or a lost server)."""
        return self.halted

    @property
    def deadline_s(self) -> float:
        assert self.settings is not None
        return self.settings.deadline_s

    def setup(self, server_config: Mapping[str, Any], output: Path) -> None:
        if self.settings is None:
            self.settings = CollectSettings.from_config(
                self.global_config.get(SECTION), server_config.get(SECTION)
            )
        settings = self.settings
        self.ledger = CollectionLedger(LiveExecutionRegistry(), output)
        remotes = _participants(server_urls(server_config, settings.participants), settings.token)
        self.coordinator = Coordinator(
            settings.store,
            remotes,
            self.ledger.registry,
            ObjectStoreTokenStore(settings.store),
            accept_unsafe_store=settings.accept_unsafe_store,
            run_id=settings.run_id_for(output),
            takeover=settings.takeover,
        )

    # -- the write gate ---------------------------------------------------------------------------
    async def enter_write(self) -> None:
        while True:
            with self._lock:
                if not self._checkpointing:
                    self._writing = True
                    return
            await asyncio.sleep(_WAIT_S)

    def row_written(self) -> None:
        self.ledger.hand_off_written()
        with self._lock:
            self._writing = False

    def _close_writes(self, timeout_s: float) -> bool:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            with self._lock:
                if not self._writing:
                    self._checkpointing = True
                    return True
            time.sleep(_WAIT_S)
        return False

    # -- checkpoints ------------------------------------------------------------------------------
    def request_checkpoint(self, reason: str) -> None:
        """Ask the checkpoint thread for a checkpoint (``"sigterm"``: then exit 75)."""
        self._reasons.append(reason)
        self._wake.set()

    def checkpoint_now(self, reason: str) -> str | None:
        """Take one checkpoint (no result is written while it runs); its id, or ``None`` if it failed."""
        if not self._close_writes(self.deadline_s):
            _say(f"checkpoint ({reason}) skipped: a result was still being written")
            return None
        done: list[ExecutionId] = []
        try:
            self.ledger.hand_off_written()
            done = self.ledger.take_handed_off()
            if done:  # their sessions and lineage leave the servers (a restore refuses live ones)
                self.coordinator.retire(done, deadline_s=self.deadline_s)
                done = []
            outcome = self.coordinator.checkpoint(deadline_s=self.deadline_s)
        except CheckpointError as exc:
            self.ledger.give_back(done)
            _say(f"checkpoint ({reason}) failed, nothing published: {exc.code}: {exc.message}")
            return None
        finally:
            if not self.halted:  # after SIGTERM (or a lost server) nothing more is written
                with self._lock:
                    self._checkpointing = False
        self.published.append(outcome.checkpoint_id)
        _say(
            f"checkpoint {outcome.checkpoint_id} published "
            f"({reason}; {self.ledger.handed_off} rows handed off)"
        )
        return outcome.checkpoint_id

    def checkpoint_loop(self) -> None:
        assert self.settings is not None
        every = self.settings.checkpoint_every_s
        due = time.monotonic() + every
        while not self._stop.is_set():
            woke = self._wake.wait(max(0.0, min(_WATCH_S, due - time.monotonic())))
            self._wake.clear()
            if self._stop.is_set():
                return
            reasons = list(self._reasons)
            self._reasons.clear()
            if not woke and time.monotonic() >= due:
                reasons.append("timer")
            if not reasons:
                lost = self._server_lost()
                if lost is not None:  # a crashed server: the re-run restores it with the rest
                    self.exit_note = f"{lost}: no checkpoint taken (the last one stands)"
                    self._exit_preempted(checkpoint=False)
                    return
                continue
            due = time.monotonic() + every
            if "sigterm" in reasons:
                self.exit_note = "preempted (SIGTERM)"
                self._exit_preempted(checkpoint=True)
                return
            self.checkpoint_now(reasons[0])

    def _exit_preempted(self, *, checkpoint: bool) -> None:
        """Send and write nothing more, (checkpoint,) and end the run with exit 75."""
        self.halted = True
        if checkpoint:
            self.checkpoint_now("sigterm")
        elif not self._close_writes(self.deadline_s):
            _say("a result was still being written; the re-run completes it from the output")
        self.preempted = True
        if self.loop is not None and self.task is not None:
            self.loop.call_soon_threadsafe(self.task.cancel)

    def _server_lost(self) -> str | None:
        """A participant that restarted since the last checkpoint or restore (another
        incarnation), or that has not answered for ``_LOST_AFTER`` polls."""
        known = self.coordinator.incarnations
        for participant in self.coordinator.participants:
            name = getattr(participant, "base_url", repr(participant))
            try:
                caps = participant.capabilities()
                status = participant.status()
            except Exception:
                self._misses[name] = self._misses.get(name, 0) + 1
                if self._misses[name] >= _LOST_AFTER:
                    return f"the server at {name} does not answer"
                continue
            self._misses.pop(name, None)
            key = f"{caps.kind}/{caps.instance}"
            if key in known and status.incarnation != known[key]:
                return f"{key} at {name} restarted (incarnation {known[key]} -> {status.incarnation})"
        return None

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    # -- start or resume ----------------------------------------------------------------------------
    def start(self, config: RolloutCollectionConfig) -> None:
        """Resume this run from its last checkpoint if it published one, then publish one before
        any row is sent (so a later re-run always finds one)."""
        assert self.settings is not None
        source = self.coordinator.latest_of_run()
        if source is None:
            _say(f"run {self.coordinator.run_id}: no checkpoint in {self.settings.store}; starting")
            if self.checkpoint_now("start") is None:
                raise InvalidArgumentError("the first checkpoint was not published: not collecting")
            return
        plan = load_checkpoint(self.coordinator.store, source)
        live = [p.execution for p in plan.rollouts.values() if p.disposition != "completed"]
        outcome = self.coordinator.recover(live, checkpoint_id=source, deadline_s=self.deadline_s)
        counts = {k: int(v) for k, v in outcome.plan.counts().items()}
        materialized = config.materialized_jsonl_fpath
        rollout_ids = _materialized_ids(materialized) if materialized.exists() else []
        settled = self.ledger.reconcile(rollout_ids, self._retire)
        config.resume_from_cache = True
        _say(f"run {self.coordinator.run_id}: restored {source} {counts}; {settled}")
        if self.checkpoint_now("resume") is None:
            raise InvalidArgumentError("the checkpoint after the restore was not published: not resuming")

    def _retire(self, executions: list[ExecutionId]) -> None:
        self.coordinator.retire(executions, deadline_s=self.deadline_s)

    def install_signals(self) -> Any:
        if threading.current_thread() is not threading.main_thread():
            log.warning("not in the main thread: SIGUSR1/SIGTERM checkpoints are off")
            return lambda: None
        previous = {
            signal.SIGUSR1: signal.signal(signal.SIGUSR1, lambda *_: self.request_checkpoint("sigusr1")),
            signal.SIGTERM: signal.signal(signal.SIGTERM, lambda *_: self.request_checkpoint("sigterm")),
        }

        def restore() -> None:
            for number, handler in previous.items():
                signal.signal(number, handler)

        return restore


def _participants(urls: Mapping[str, str], token: str) -> list[RemoteParticipant]:
    out = []
    for name, url in urls.items():
        remote = RemoteParticipant(url, token=token)
        try:
            remote.capabilities()
        except Exception as exc:
            raise InvalidArgumentError(
                f"server {name} at {url} does not answer the checkpoint control routes "
                f"({type(exc).__name__}: {exc}); serve it checkpointed, or name the servers to checkpoint "
                f"in {SECTION}.participants"
            ) from None
        out.append(remote)
    return out


def _materialized_ids(path: Path) -> list[str]:
    import orjson

    with path.open("rb") as f:
        return [row_rollout_id(orjson.loads(line)) for line in f if line.strip()]
