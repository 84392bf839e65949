"""The settings of a checkpointed Gym rollout collection (:mod:`.collect`): the Gym config's
``rollout_checkpoint`` block (:class:`CollectSettings`) and the servers it checkpoints
(:func:`server_urls`)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import InvalidArgumentError
from ...ids import validate_id

__all__ = ["SECTION", "SERVER_TYPES", "STATELESS_RELAYS", "CollectSettings", "server_urls"]

SECTION = "rollout_checkpoint"
SERVER_TYPES = ("resources_servers", "responses_api_agents", "responses_api_models", "environment_servers")
STATELESS_RELAYS = frozenset({"legacy_agent"})
"""Environment-server types that only relay ``/run`` (no state): never participants."""


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
