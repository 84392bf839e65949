"""A checkpointing NeMo Gym rollout collection that resumes after any crash.

:class:`CheckpointingCollector` is Gym's own ``RolloutCollectionHelper`` (the same output JSONL,
failures sidecar, materialized inputs and aggregate metrics, so Gym's aggregation works
unchanged) whose collector also acts as the checkpoint controller:

* every row gets ``_ng_rollout_id`` and ``_ng_attempt_index``; the registry sees it dispatched and
  started (just before its ``/run``), finished (``/run`` answered) and handed off (its result is
  in the output JSONL, fsynced);
* a coordinator over the Gym servers checkpoints every ``checkpoint_every_s``, on ``SIGUSR1``
  (and goes on) and on ``SIGTERM`` (then exits 75, for Slurm's ``--signal=B:TERM@120``); while a
  checkpoint runs, no result is written, so a row in the output is ``completed`` in every later
  checkpoint; before each checkpoint the rows handed off since the last one are retired at the
  servers (Gym's ``/run`` leaves a stateful tool server's session open);
* a re-run with the same arguments and store finds this run's last published checkpoint
  (the run id is derived from the output path), restores it into the servers, completes in the
  registry what the output already holds, retires what may still run from the crashed run,
  publishes a checkpoint, and lets Gym's ``resume_from_cache`` send the rest: continued rollouts
  as attempt N+1 (they resume at their boundary), the others afresh as their next attempt.

Entry points: ``rollout-checkpoint gym collect`` (the ``ng_collect_rollouts`` path, same Hydra
overrides) and :func:`collect`, the ``rollout_collection_driver`` of ``gym eval run`` /
``ng_e2e_collect_rollouts``. Settings: the Gym config's ``rollout_checkpoint`` block
(:class:`CollectSettings`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_gym.rollout_collection import RolloutCollectionConfig, RolloutCollectionHelper
from pydantic import PrivateAttr

from ...coordinator import Coordinator
from ...errors import CheckpointError, InvalidArgumentError
from ...ids import ExecutionId, validate_id
from ...reader import load_checkpoint
from ...registry import LiveExecutionRegistry
from ...server import RemoteParticipant
from ...tokens import ObjectStoreTokenStore
from ._collect_ledger import ROLLOUT_ID_KEY, CollectionLedger, row_rollout_id

__all__ = [
    "EXIT_PREEMPTED",
    "CheckpointingCollector",
    "CollectSettings",
    "CollectionController",
    "collect",
    "main",
]

log = logging.getLogger("rollout_checkpoint.integrations.nemo_gym.collect")

EXIT_PREEMPTED = 75
"""The exit status after a SIGTERM checkpoint (``EX_TEMPFAIL``): re-run to resume."""
SECTION = "rollout_checkpoint"
SERVER_TYPES = ("resources_servers", "responses_api_agents", "responses_api_models", "environment_servers")
STATELESS_RELAYS = frozenset({"legacy_agent"})
"""Environment-server types that only relay ``/run`` (no state): never participants."""
_WAIT_S = 0.02
_WATCH_S = 1.0
"""Seconds between the checks that every participant still answers as the same incarnation."""
_LOST_AFTER = 5


def _say(message: str) -> None:
    print(f"rollout-checkpoint: {message}", flush=True)


@dataclass(frozen=True)
class CollectSettings:
    """The ``rollout_checkpoint`` block of the Gym config (Hydra: ``+rollout_checkpoint.store=...``).

    ``store`` (else ``ROLLOUT_CHECKPOINT_STORE``); the control token from ``token_file`` or
    ``ROLLOUT_CHECKPOINT_TOKEN`` / ``ROLLOUT_CHECKPOINT_TOKEN_FILE`` (never inline: Gym's head
    server serves its config to anyone who asks); ``checkpoint_every_s`` (600); ``run_id``
    (default: derived from the output path, so a re-run resumes); ``participants`` (server names;
    default every resources server, agent and model server, and every environment server that is
    not a stateless relay); ``accept_unsafe_store``; ``deadline_s`` (120) per checkpoint;
    ``takeover`` (a store holds one run: a new collection on a store another run owns needs it).
    """

    store: str
    token: str
    checkpoint_every_s: float = 600.0
    run_id: str | None = None
    participants: tuple[str, ...] | None = None
    accept_unsafe_store: bool = False
    deadline_s: float = 120.0
    takeover: bool = False

    @classmethod
    def from_config(cls, *blocks: Mapping[str, Any] | None) -> CollectSettings:
        """From ``rollout_checkpoint`` blocks (earlier ones win) and the environment."""
        merged: dict[str, Any] = {}
        for block in reversed(blocks):
            merged.update({k: v for k, v in cls.check_keys(block).items() if v is not None})
        store = str(merged.get("store") or os.environ.get("ROLLOUT_CHECKPOINT_STORE", ""))
        if not store:
            raise InvalidArgumentError(
                f"no checkpoint store: set +{SECTION}.store=URL or ROLLOUT_CHECKPOINT_STORE"
            )
        token_file = merged.get("token_file") or os.environ.get("ROLLOUT_CHECKPOINT_TOKEN_FILE")
        if token_file:
            try:
                token = Path(str(token_file)).read_text(encoding="utf-8").strip().split("\n")[0].strip()
            except OSError as exc:
                raise InvalidArgumentError(
                    f"cannot read the token file {token_file}: {exc.strerror}"
                ) from None
        else:
            token = os.environ.get("ROLLOUT_CHECKPOINT_TOKEN", "").strip()
        if not token:
            raise InvalidArgumentError(
                f"no control token: set ROLLOUT_CHECKPOINT_TOKEN or +{SECTION}.token_file=PATH"
            )
        every = float(merged.get("checkpoint_every_s", 600.0))
        if every <= 0:
            raise InvalidArgumentError(f"{SECTION}.checkpoint_every_s must be positive, got {every}")
        names = merged.get("participants")
        unsafe = merged.get(
            "accept_unsafe_store", os.environ.get("ROLLOUT_CHECKPOINT_ACCEPT_UNSAFE_STORE") == "1"
        )
        return cls(
            store=store,
            token=token,
            checkpoint_every_s=every,
            run_id=None if merged.get("run_id") is None else validate_id(str(merged["run_id"]), "run_id"),
            participants=None if names is None else tuple(str(n) for n in names),
            accept_unsafe_store=_flag(unsafe),
            deadline_s=float(merged.get("deadline_s", 120.0)),
            takeover=_flag(merged.get("takeover", False)),
        )

    @classmethod
    def check_keys(cls, block: Mapping[str, Any] | None) -> dict[str, Any]:
        """The block as a dict; an unknown key or an inline token is refused."""
        out = {str(k): v for k, v in dict(block or {}).items()}
        if "token" in out:
            raise InvalidArgumentError(
                f"{SECTION}.token is not read (Gym's head server serves the config to anyone): use "
                f"{SECTION}.token_file or ROLLOUT_CHECKPOINT_TOKEN"
            )
        unknown = sorted(set(out) - {*cls.__dataclass_fields__, "token_file"})
        if unknown:
            raise InvalidArgumentError(f"unknown {SECTION} setting(s): {', '.join(unknown)}")
        return out

    def run_id_for(self, output: Path) -> str:
        if self.run_id is not None:
            return self.run_id
        digest = hashlib.sha256(str(output.resolve()).encode()).hexdigest()[:20]
        return f"gym-collect-{digest}"


def _flag(value: Any) -> bool:
    return str(value).lower() in ("1", "true", "yes")


def server_urls(global_config: Mapping[str, Any], names: tuple[str, ...] | None) -> dict[str, str]:
    """``name -> http://host:port`` of the servers a collection checkpoints."""
    found: dict[str, str] = {}
    for name, block in global_config.items():
        if not isinstance(block, Mapping):
            continue
        for server_type in SERVER_TYPES:
            impls = block.get(server_type)
            if not isinstance(impls, Mapping) or len(impls) != 1:
                continue
            impl_name, impl = next(iter(impls.items()))
            if not isinstance(impl, Mapping) or impl.get("port") is None:
                continue
            if names is None and server_type == "environment_servers" and impl_name in STATELESS_RELAYS:
                continue
            found[str(name)] = f"http://{impl.get('host') or '127.0.0.1'}:{int(impl['port'])}"
    if names is not None:
        missing = [n for n in names if n not in found]
        if missing:
            raise InvalidArgumentError(f"{SECTION}.participants names unknown servers: {', '.join(missing)}")
        return {n: found[n] for n in names}
    if not found:
        raise InvalidArgumentError("the Gym config lists no server to checkpoint")
    return found


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


class CheckpointingCollector(RolloutCollectionHelper):
    """Gym's rollout collection, checkpointed (see the module docstring)."""

    _ctl: Any = PrivateAttr(default=None)

    def __init__(
        self, settings: CollectSettings | None = None, global_config: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__()
        self._ctl = CollectionController(settings, global_config or {})

    @property
    def controller(self) -> CollectionController:
        ctl: CollectionController = self._ctl
        return ctl

    # -- Gym hooks --------------------------------------------------------------------------------
    def setup_server_client(self, head_server_config: Any = None) -> Any:
        return _TrackingClient(super().setup_server_client(head_server_config), self.controller)

    def _preprocess_rows_from_config(self, config: RolloutCollectionConfig) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = super()._preprocess_rows_from_config(config)
        self.controller.ledger.stamp(rows)
        return rows

    def _load_from_cache(self, config: RolloutCollectionConfig, **kwargs: Any) -> Any:
        input_rows, rows, results, result_strs = super()._load_from_cache(config, **kwargs)
        self.controller.ledger.stamp(input_rows)
        return input_rows, rows, results, result_strs

    def _run_examples_with_metadata(self, examples: list[dict[str, Any]], *args: Any, **kwargs: Any) -> Any:
        inner = super()._run_examples_with_metadata(examples, *args, **kwargs)
        self.controller.inner_iterators.append(inner)
        return _GatedCompletions(inner, self.controller)

    # -- the run ------------------------------------------------------------------------------------
    async def run_from_config(self, config: RolloutCollectionConfig) -> Any:
        ctl = self.controller
        try:
            server_config = dict(super().setup_server_client().global_config_dict)
        except ValueError as exc:  # Gym's "Could not connect to the head server at ..."
            raise InvalidArgumentError(" ".join(str(exc).split())) from None
        output = Path(config.output_jsonl_fpath)
        lock = _lock_output(output)
        ctl.loop = asyncio.get_running_loop()
        restore_signals = ctl.install_signals()  # a SIGTERM while starting is honoured once it runs
        thread = threading.Thread(target=ctl.checkpoint_loop, name="rollout-checkpoint-collect", daemon=True)
        try:
            await asyncio.to_thread(ctl.setup, server_config, output)
            await asyncio.to_thread(ctl.start, config)
            ctl.task = asyncio.ensure_future(super().run_from_config(config))
            thread.start()
            try:
                result = await ctl.task
            except asyncio.CancelledError:
                if not ctl.preempted:
                    raise
                _say(f"{ctl.exit_note}; exiting {EXIT_PREEMPTED}: re-run the same command to resume")
                raise SystemExit(EXIT_PREEMPTED) from None
            ctl.stop()
            await asyncio.to_thread(thread.join, ctl.deadline_s + 30)
            await asyncio.to_thread(ctl.checkpoint_now, "final")
            return result
        finally:
            ctl.stop()
            restore_signals()
            for inner in ctl.inner_iterators:
                close = getattr(inner, "aclose", None)
                if close is not None:
                    with contextlib.suppress(Exception):
                        await close()
            if thread.is_alive():
                await asyncio.to_thread(thread.join, ctl.deadline_s + 30)
            lock.close()


def _lock_output(output: Path) -> Any:
    """One collection at a time writes an output: an exclusive lock on ``<output>.lock`` for the
    process's life (the kernel drops it when the process dies, SIGKILL included)."""
    import fcntl

    output.parent.mkdir(parents=True, exist_ok=True)
    handle = open(output.with_name(output.name + ".lock"), "a")  # noqa: SIM115 (held for the run)
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise InvalidArgumentError(
            f"another collection is writing {output} (it holds {output.name}.lock): wait for it or stop it"
        ) from None
    return handle


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


async def collect(
    rollout_collection_config: RolloutCollectionConfig, global_config_dict: Mapping[str, Any]
) -> Any:
    """Gym's ``rollout_collection_driver`` (``gym eval run`` / ``ng_e2e_collect_rollouts``):
    ``+rollout_collection_driver=rollout_checkpoint.integrations.nemo_gym.collect:collect``."""
    return await CheckpointingCollector(global_config=global_config_dict).run_from_config(
        rollout_collection_config
    )


def main(overrides: list[str]) -> int:
    """``rollout-checkpoint gym collect OVERRIDES...``: ``ng_collect_rollouts`` checkpointed.

    ``overrides`` are the Hydra overrides ``ng_collect_rollouts`` takes (``+input_jsonl_fpath=...``,
    ``+output_jsonl_fpath=...``, ``+agent_name=...``, ``+rollout_checkpoint.store=...``). Returns
    the exit status: 0, 75 after a SIGTERM checkpoint, 1 on a user's mistake (raised as
    :class:`~rollout_checkpoint.errors.InvalidArgumentError` or Gym's ``ConfigError``).
    """
    import sys

    from nemo_gym.config_types import ConfigError
    from nemo_gym.global_config import get_global_config_dict
    from omegaconf import OmegaConf
    from pydantic import ValidationError

    sys.argv = ["rollout-checkpoint gym collect", *overrides]
    try:
        global_config = get_global_config_dict()
        config = RolloutCollectionConfig.model_validate(global_config)
        resolved = OmegaConf.to_container(global_config, resolve=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise InvalidArgumentError(f"{where or 'config'}: {first.get('msg')}") from None
    except ConfigError as exc:
        raise InvalidArgumentError(" ".join(str(exc).split())) from None
    assert isinstance(resolved, dict)
    CollectSettings.check_keys(resolved.get(SECTION))
    collector = CheckpointingCollector(global_config={str(k): v for k, v in resolved.items()})
    try:
        asyncio.run(collector.run_from_config(config))
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0
