"""``RayDeployment``: participant hosts started from specs, placed, watched and removed.

Placement is one of: a placement group (``STRICT_SPREAD``: one node per host, what NeMo-RL does
for its Gym actors; ``PACK``), custom resources (``HostSpec.resources``, e.g. a resource only
the nodes meant for environments advertise), or node affinity (``HostSpec.node_id``). Startup
returns once every host answers. Data-plane addresses are asked again on every
:meth:`RayDeployment.endpoints` call (and by :func:`resolve_endpoint` inside the cluster), since
a host Ray restarted on another node has another address.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)

from ...errors import InvalidArgumentError
from ...ids import validate_id
from ...server import ParticipantUnreachableError
from ._host import ParticipantHost, host_actor
from ._participant import RayParticipant
from ._tokens import TokenSource

__all__ = ["ACTOR_PREFIX", "HostSpec", "RayDeployment", "resolve_endpoint"]

ACTOR_PREFIX = "rc-host-"
"""A host's Ray actor name is this plus its spec's name (in the deployment's namespace)."""

Placement = Literal["STRICT_SPREAD", "PACK", "SPREAD", "STRICT_PACK"]


@dataclass(frozen=True)
class HostSpec:
    """One host: ``name`` (an identifier, also its actor name), ``build``
    (``package.module:function``), ``settings`` (plain environment for the build, no secrets),
    ``workers``, ``num_cpus`` it reserves, custom ``resources``, ``node_id`` (hard affinity),
    ``bundle`` (its placement-group bundle; default ``{"CPU": num_cpus, **resources}``), Ray's
    ``max_restarts`` / ``max_task_retries`` and ``start_paused``."""

    name: str
    build: str
    settings: Mapping[str, str] = field(default_factory=dict)
    workers: int = 1
    num_cpus: float = 0.25
    resources: Mapping[str, float] = field(default_factory=dict)
    node_id: str | None = None
    bundle: Mapping[str, float] | None = None
    max_restarts: int = -1
    max_task_retries: int = 0
    start_paused: bool = False

    def __post_init__(self) -> None:
        validate_id(self.name, "host name")


def _bundle(spec: HostSpec) -> dict[str, float]:
    """A host's placement-group bundle: its own, else what the actor asks (its CPUs and custom
    resources: an actor in a bundle must fit in it)."""
    if spec.bundle is not None:
        return dict(spec.bundle)
    return {"CPU": spec.num_cpus, **spec.resources}


def resolve_endpoint(name: str, *, namespace: str | None = None, timeout_s: float = 30.0) -> str:
    """The data-plane URL of the host ``name`` now (asked of its actor: never a URL captured at
    build time). Usable in a build function running inside the cluster."""
    handle = ray.get_actor(f"{ACTOR_PREFIX}{name}", namespace=namespace)
    return str(ray.get(handle.endpoint.remote(), timeout=timeout_s))


class RayDeployment:
    """Hosts started from ``specs`` (in prepare order) writing to ``store``.

    ``token``: where every node reads the control token. ``placement``: a placement-group
    strategy (``None``: each spec's own resources or node affinity). ``host_class``: a
    :class:`ParticipantHost` subclass. ``lifetime="detached"`` keeps the hosts past the driver
    (by default they die with it). Use as a context manager, or call :meth:`shutdown`.
    """

    def __init__(
        self,
        specs: Sequence[HostSpec],
        *,
        store: str,
        token: TokenSource | None = None,
        placement: Placement | None = None,
        namespace: str | None = None,
        lifetime: Literal["detached"] | None = None,
        accept_unsafe_store: bool = False,
        host_class: type[Any] = ParticipantHost,
        startup_timeout_s: float = 300.0,
    ) -> None:
        names = [s.name for s in specs]
        if len(set(names)) != len(names) or not names:
            raise InvalidArgumentError(f"host names must be unique and at least one: {names}")
        self.specs = list(specs)
        self.store = store
        self.token = token or TokenSource()
        self.placement = placement
        self.namespace = namespace
        self.lifetime = lifetime
        self.accept_unsafe_store = accept_unsafe_store
        self.startup_timeout_s = startup_timeout_s
        self._host_class = host_class
        self.handles: dict[str, Any] = {}
        self.group: PlacementGroup | None = None
        self._participants: list[RayParticipant] = []
        self._incarnations: dict[str, str] = {}
        self.restarts: dict[str, int] = {s.name: 0 for s in specs}

    def __enter__(self) -> RayDeployment:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- start -----------------------------------------------------------------------------------
    def start(self) -> RayDeployment:
        """Place and start every host; returns once each answers (else shuts down and raises)."""
        try:
            if self.placement is not None:
                bundles = [_bundle(s) for s in self.specs]
                self.group = placement_group(bundles, strategy=self.placement)
                ready = self.group.ready()
                try:
                    ray.get(ready, timeout=self.startup_timeout_s)
                except ray.exceptions.GetTimeoutError:
                    raise ParticipantUnreachableError(
                        f"placement group {self.placement} of {len(bundles)} bundles {bundles} could not "
                        f"be placed in {self.startup_timeout_s:.0f} s (too few nodes or resources?)"
                    ) from None
            for index, spec in enumerate(self.specs):
                self.handles[spec.name] = self._start(index, spec)
            self.check(timeout_s=self.startup_timeout_s)
        except BaseException:
            self.shutdown()
            raise
        # for a coordinator, which reads no commit reply's executions or restarts lists
        self._participants = [
            RayParticipant(self.handles[s.name], name=s.name, brief_commits=True) for s in self.specs
        ]
        return self

    def _start(self, index: int, spec: HostSpec) -> Any:
        options: dict[str, Any] = {
            "name": f"{ACTOR_PREFIX}{spec.name}",
            "max_restarts": spec.max_restarts,
            "max_task_retries": spec.max_task_retries,
            "num_cpus": spec.num_cpus,
        }
        if self.namespace is not None:
            options["namespace"] = self.namespace
        if self.lifetime is not None:
            options["lifetime"] = self.lifetime
        if spec.resources:
            options["resources"] = dict(spec.resources)
        if self.group is not None:
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                self.group, placement_group_bundle_index=index
            )
        elif spec.node_id is not None:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(spec.node_id, soft=False)
        actor = host_actor(self._host_class)
        return actor.options(**options).remote(
            spec.build,
            store=self.store,
            token=self.token,
            settings=dict(spec.settings),
            workers=spec.workers,
            accept_unsafe_store=self.accept_unsafe_store,
            start_paused=spec.start_paused,
            name=spec.name,
        )

    # -- use -------------------------------------------------------------------------------------
    def participants(self) -> list[RayParticipant]:
        """One :class:`RayParticipant` per host, in the specs' (prepare) order, with brief
        commit replies (what a coordinator needs)."""
        return list(self._participants)

    def endpoints(self, timeout_s: float = 60.0) -> dict[str, str]:
        """Each host's data-plane URL, asked now (a host that moved answers its new address)."""
        refs = {name: handle.endpoint.remote() for name, handle in self.handles.items()}
        return {name: str(ray.get(ref, timeout=timeout_s)) for name, ref in refs.items()}

    def health(self, timeout_s: float = 60.0) -> dict[str, dict[str, Any]]:
        """Each host's :meth:`ParticipantHost.health` (waits while a host restarts)."""
        refs = {name: handle.health.remote() for name, handle in self.handles.items()}
        out: dict[str, dict[str, Any]] = {}
        end = time.monotonic() + timeout_s
        for name, ref in refs.items():
            try:
                out[name] = ray.get(ref, timeout=max(0.1, end - time.monotonic()))
            except Exception as exc:
                raise ParticipantUnreachableError(
                    f"host {name} did not answer its health check: {type(exc).__name__}: {exc}"[:500],
                    participant=name,
                ) from None
        return out

    def check(self, timeout_s: float = 120.0) -> list[str]:
        """Wait until every host answers; the names of those restarted since the last check
        (their incarnation changed: Ray reconstructed them). Counted in :attr:`restarts`."""
        end = time.monotonic() + timeout_s
        while True:
            try:
                health = self.health(timeout_s=max(1.0, min(30.0, end - time.monotonic())))
                break
            except ParticipantUnreachableError:
                if time.monotonic() > end:
                    raise
                time.sleep(0.5)  # a restarting actor answers once its __init__ ran again
        restarted = []
        for name, info in health.items():
            before = self._incarnations.get(name)
            if before is not None and before != info["incarnation"]:
                restarted.append(name)
                self.restarts[name] += 1
            self._incarnations[name] = info["incarnation"]
        return restarted

    # -- stop --------------------------------------------------------------------------------------
    def shutdown(self, grace_s: float = 10.0) -> None:
        """Stop every host gracefully, then ``ray.kill`` it (no restart) and remove the
        placement group. Idempotent."""
        refs = []
        for handle in self.handles.values():
            with contextlib.suppress(Exception):
                refs.append(handle.shutdown.remote())
        if refs:
            with contextlib.suppress(Exception):
                ray.wait(refs, num_returns=len(refs), timeout=grace_s)
        for handle in self.handles.values():
            with contextlib.suppress(Exception):
                ray.kill(handle, no_restart=True)
        self.handles.clear()
        if self.group is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(self.group)
            self.group = None
