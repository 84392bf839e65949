"""``CheckpointControlMixin``: checkpoint control methods for an actor that runs its own servers.

An existing actor (NeMo-RL's ``NemoGym`` starts its Gym servers as subprocesses of the actor)
inherits this mixin and says where its local servers are (:meth:`checkpoint_servers`); a
driver-side controller then calls ``checkpoint_prepare / renew / commit / restore / resume /
retire / forget(..., deadline_ts=)`` on the actor, and each call fans out to those servers'
control routes over HTTP (on the actor's own node), with the token read on the node
(:meth:`checkpoint_token`). ``docs/ray.md`` documents how the replies map to the SDK's.

The actor needs ``max_concurrency > 1`` (or concurrency groups) so that ``checkpoint_resume``
and ``checkpoint_status`` answer while a ``checkpoint_prepare`` waits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ...errors import InvalidArgumentError
from ...ids import ExecutionId
from ...server import RemoteParticipant
from ._tokens import TokenSource

__all__ = ["CheckpointControlMixin"]

Episode = ExecutionId | Mapping[str, Any]


def _executions(episodes: Iterable[Episode] | None) -> list[ExecutionId] | None:
    if episodes is None:
        return None
    return [e if isinstance(e, ExecutionId) else ExecutionId(**dict(e)) for e in episodes]


class CheckpointControlMixin:
    """Checkpoint control forwarded to the actor's local servers (see the module doc).

    Override :meth:`checkpoint_servers`; optionally :meth:`checkpoint_token`. Every reply is
    ``{"servers": {name: <the SDK reply as JSON>}}`` plus, for prepare, ``ready`` (every server
    ready) and, for every reply carrying incarnations, ``incarnations`` (``{name: id}``). An SDK
    refusal is raised as its typed error (it reaches the caller as ``RayTaskError.cause``).
    """

    checkpoint_token_source: TokenSource = TokenSource()

    def checkpoint_servers(self) -> Mapping[str, str]:
        """``{name: base URL}`` of this actor's checkpointable servers (in prepare order).

        The one hook a subclass must define: without it every checkpoint call is refused with
        ``invalid_argument`` (it reaches the driver typed, as ``RayTaskError.cause``)."""
        raise InvalidArgumentError(
            f"{type(self).__name__} uses CheckpointControlMixin but does not define "
            "checkpoint_servers() (the {name: base URL} of the actor's local servers)"
        )

    def checkpoint_token(self) -> str:
        """The control token of the local servers (default: :attr:`checkpoint_token_source`)."""
        return self.checkpoint_token_source.read()

    def _rc_remotes(self) -> dict[str, RemoteParticipant]:
        servers = dict(self.checkpoint_servers())
        cache: dict[str, RemoteParticipant] = self.__dict__.setdefault("_rc_remote_cache", {})
        for name, url in servers.items():
            if name not in cache or cache[name].base_url != url.rstrip("/"):
                cache[name] = RemoteParticipant(url, token=self.checkpoint_token(), brief_commits=True)
        return {name: cache[name] for name in servers}

    def _rc_fan_out(self, call: Callable[[RemoteParticipant], Any]) -> dict[str, Any]:
        remotes = self._rc_remotes()
        with ThreadPoolExecutor(max_workers=max(1, len(remotes))) as pool:
            futures = {name: pool.submit(call, remote) for name, remote in remotes.items()}
            return {name: future.result() for name, future in futures.items()}

    @staticmethod
    def _rc_replies(replies: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"servers": {n: r.model_dump(mode="json") for n, r in replies.items()}}
        out["incarnations"] = {n: r.incarnation for n, r in replies.items()}
        return out

    def checkpoint_status(self) -> dict[str, Any]:
        return self._rc_replies(self._rc_fan_out(lambda r: r.status()))

    def checkpoint_prepare(self, checkpoint_id: str, *, deadline_ts: float) -> dict[str, Any]:
        replies = self._rc_fan_out(lambda r: r.prepare(checkpoint_id, deadline_ts))
        return {"ready": all(r.ready for r in replies.values()), **self._rc_replies(replies)}

    def checkpoint_renew(self, checkpoint_id: str, *, deadline_ts: float) -> dict[str, Any]:
        return {"servers": self._rc_fan_out(lambda r: r.renew(checkpoint_id, deadline_ts))}

    def checkpoint_commit(
        self,
        checkpoint_id: str,
        checkpoint_root: str,
        episodes: Iterable[Episode] | None = None,
        *,
        deadline_ts: float,
    ) -> dict[str, Any]:
        scope = _executions(episodes)
        return self._rc_replies(
            self._rc_fan_out(lambda r: r.commit(checkpoint_id, checkpoint_root, deadline_ts, scope))
        )

    def checkpoint_restore(
        self,
        restore_id: str,
        checkpoint_root: str,
        episodes: Iterable[Episode] | None = None,
        *,
        source_checkpoint_id: str,
        deadline_ts: float,
    ) -> dict[str, Any]:
        scope = _executions(episodes)
        return self._rc_replies(
            self._rc_fan_out(
                lambda r: r.restore(restore_id, source_checkpoint_id, checkpoint_root, deadline_ts, scope)
            )
        )

    def checkpoint_resume(self, checkpoint_id: str, *, deadline_ts: float) -> dict[str, Any]:
        return self._rc_replies(self._rc_fan_out(lambda r: r.resume(checkpoint_id, deadline_ts)))

    def checkpoint_abort_restore(self, restore_id: str, *, deadline_ts: float) -> dict[str, Any]:
        return self._rc_replies(self._rc_fan_out(lambda r: r.abort_restore(restore_id, deadline_ts)))

    def checkpoint_retire(self, episodes: Sequence[Episode], *, deadline_ts: float) -> dict[str, Any]:
        batch = _executions(episodes) or []
        return {"servers": self._rc_fan_out(lambda r: r.retire(batch, deadline_ts))}

    def checkpoint_forget(
        self, rollout_ids: Sequence[str], *, deadline_ts: float | None = None
    ) -> dict[str, Any]:
        del deadline_ts  # forget has no deadline in the protocol; accepted for a uniform fan-out
        return {"servers": self._rc_fan_out(lambda r: r.forget(list(rollout_ids)))}
