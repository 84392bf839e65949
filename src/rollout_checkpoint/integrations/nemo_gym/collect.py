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
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nemo_gym.rollout_collection import RolloutCollectionConfig, RolloutCollectionHelper
from pydantic import PrivateAttr

from ...errors import InvalidArgumentError

# `X as X`: defined in the private modules since the split, still importable from this module
from ._collect_controller import CollectionController, _GatedCompletions, _say, _TrackingClient
from ._collect_controller import _materialized_ids as _materialized_ids
from ._collect_controller import _participants as _participants
from ._collect_settings import SECTION, CollectSettings
from ._collect_settings import SERVER_TYPES as SERVER_TYPES
from ._collect_settings import STATELESS_RELAYS as STATELESS_RELAYS
from ._collect_settings import _flag as _flag
from ._collect_settings import server_urls as server_urls

__all__ = [
    "EXIT_PREEMPTED",
    "CheckpointingCollector",
    "CollectSettings",
    "CollectionController",
    "collect",
    "main",
]

EXIT_PREEMPTED = 75
"""The exit status after a SIGTERM checkpoint (``EX_TEMPFAIL``): re-run to resume."""


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
