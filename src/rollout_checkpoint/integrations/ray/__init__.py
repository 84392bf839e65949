"""Run checkpoint participants as Ray actors across nodes (``pip install 'rollout-checkpoint[ray]'``).

* :class:`ParticipantHost` - an actor class (also a mixin) serving participants from a build
  function, in a thread or as a child ``run_server`` process group; :func:`host_actor` makes the
  Ray actor class with the concurrency groups that keep a parked prepare from blocking
  ``status`` or ``resume``;
* :class:`RayParticipant` - sync and async participant control over an actor handle, for a
  driver-side :class:`~rollout_checkpoint.coordinator.Coordinator`;
* :class:`RayDeployment` / :class:`HostSpec` - start hosts from specs, place them (placement
  group, custom resources or node affinity), hand out data-plane endpoints, report restarts,
  shut down;
* :class:`CheckpointControlMixin` - ``checkpoint_prepare / renew / commit / restore / resume /
  retire / forget`` for an existing actor that runs its own servers (NeMo-RL's ``NemoGym``);
* :class:`TokenSource` - where a node reads the control token (a file or an environment
  variable; never an actor argument nor ``runtime_env``).

Ray is imported only when one of these names is first used (module ``__getattr__``), so
``import rollout_checkpoint.integrations.ray`` works without Ray; using a name then raises
:class:`RayNotInstalledError` with the install recipe. See ``docs/ray.md``.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "CONCURRENCY_GROUPS",
    "CheckpointControlMixin",
    "HostSpec",
    "ParticipantHost",
    "RayDeployment",
    "RayNotInstalledError",
    "RayParticipant",
    "TokenSource",
    "host_actor",
    "resolve_endpoint",
]

_WHERE = {
    "TokenSource": "._tokens",
    "CONCURRENCY_GROUPS": "._host",
    "ParticipantHost": "._host",
    "host_actor": "._host",
    "RayParticipant": "._participant",
    "HostSpec": "._deployment",
    "RayDeployment": "._deployment",
    "resolve_endpoint": "._deployment",
    "CheckpointControlMixin": "._mixin",
}

INSTALL_HINT = "Ray is not installed: `pip install 'rollout-checkpoint[ray]'` (ray>=2.55,<3; see docs/ray.md)"


class RayNotInstalledError(ImportError):
    """The integration was used where ``ray`` cannot be imported."""


def __getattr__(name: str) -> Any:
    if name == "RayNotInstalledError":
        return RayNotInstalledError
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module, __name__), name)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == "ray":
            raise RayNotInstalledError(f"{INSTALL_HINT} ({exc})") from exc
        raise
    globals()[name] = value
    return value
