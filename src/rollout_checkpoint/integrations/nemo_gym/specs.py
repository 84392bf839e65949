"""Which routes of a Gym resources server open, mutate, read and close a session, where its
per-session state lives, and how it is encoded: a :class:`SessionSpec` per server class.

Built-in specs cover Gym's ``blackjack``, ``wordle``, ``example_session_state_mgmt``,
``example_multi_turn_gymnasium``, ``workplace_assistant`` and ``indirect_prompt_injection`` as
they are in the Gym version tested (:data:`GYM_VERSION_TESTED`); on another Gym version, or for
any other server, :func:`spec_for` answers ``None`` and the server is checkpointed
``restart_only`` (fail closed: its rollouts are dispatched afresh, never continued from state
nobody audited). A user describes their own server in a few lines (see ``docs/nemo-gym.md``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from ...participants import StateCodec
from .codecs import BlackjackCodec, CounterCodec, JsonEnvironmentCodec, MultiTurnCodec, WordleCodec
from .workplace import WorkplaceAssistantCodec

__all__ = [
    "BLACKJACK",
    "BUILTIN_SPECS",
    "COUNTER",
    "GYM_VERSION_TESTED",
    "INDIRECT_PROMPT_INJECTION",
    "MULTI_TURN",
    "RESTART_ONLY_CLOSE_ROUTES",
    "WORDLE",
    "WORKPLACE_ASSISTANT",
    "SessionSpec",
    "gym_version",
    "spec_for",
]

_LOG = logging.getLogger(__name__)

GYM_VERSION_TESTED = "0.7.0"
"""The ``nemo-gym`` release whose servers the built-in specs and codecs were written against."""

PASSTHROUGH_ROUTES = frozenset({"/aggregate_metrics", "/reverify_mode"})
"""Routes that never touch a session: served without a rollout identity."""

RESTART_ONLY_CLOSE_ROUTES = frozenset({"/close_session", "/verify", "/close"})
"""Routes that end a session of a server without a spec (a Gymnasium ``/step`` that answers
``terminated`` or ``truncated`` ends it too)."""


@dataclass(frozen=True)
class SessionSpec:
    """How one Gym resources server keeps its sessions.

    ``state_attr`` names the server's dict ``{session cookie id: state}``; ``codec`` encodes one
    value of it. ``open_routes`` and ``mutate_routes`` run under the session's lock and admission
    (closed during a checkpoint's prepare, parked until resume); ``read_routes`` only need a
    current attempt; ``close_routes`` end the session after they answer. A route in no set is
    served as Gym serves it (no identity needed) unless ``strict`` (the default), which treats
    every other POST as a mutation.
    """

    name: str
    server_class: str
    state_attr: str
    codec: StateCodec
    open_routes: frozenset[str]
    mutate_routes: frozenset[str]
    read_routes: frozenset[str] = frozenset()
    close_routes: frozenset[str] = frozenset()
    gym_versions: tuple[str, ...] = (GYM_VERSION_TESTED,)
    strict: bool = True
    passthrough_routes: frozenset[str] = field(default=PASSTHROUGH_ROUTES)

    def sessions(self, server: Any) -> dict[str, Any]:
        value = getattr(server, self.state_attr)
        if not isinstance(value, dict):
            raise TypeError(f"{type(server).__name__}.{self.state_attr} is not a dict")
        return value

    def read(self, server: Any, session_id: str) -> Any | None:
        return self.sessions(server).get(session_id)

    def install(self, server: Any, session_id: str, state: Any) -> None:
        self.sessions(server)[session_id] = state

    def drop(self, server: Any, session_id: str) -> None:
        self.sessions(server).pop(session_id, None)


def _gymnasium_spec(name: str, server_class: str, codec: StateCodec) -> SessionSpec:
    """A spec for a Gym ``GymnasiumServer``: ``/reset`` opens a session, ``/step`` mutates it,
    ``/close`` ends it; the state lives in its ``session_state`` dict."""
    return SessionSpec(
        name=name,
        server_class=server_class,
        state_attr="session_state",
        codec=codec,
        open_routes=frozenset({"/reset"}),
        mutate_routes=frozenset({"/step"}),
        close_routes=frozenset({"/close"}),
    )


BLACKJACK = _gymnasium_spec("blackjack", "resources_servers.blackjack.app:BlackjackEnv", BlackjackCodec())

WORDLE = _gymnasium_spec("wordle", "resources_servers.wordle.app:WordleResourcesServer", WordleCodec())

COUNTER = SessionSpec(
    name="example_session_state_mgmt",
    server_class="resources_servers.example_session_state_mgmt.app:StatefulCounterResourcesServer",
    state_attr="session_id_to_counter",
    codec=CounterCodec(),
    open_routes=frozenset({"/seed_session"}),
    # get_counter_value creates a missing counter (setdefault): a mutation, not a read
    mutate_routes=frozenset({"/increment_counter", "/get_counter_value"}),
    read_routes=frozenset({"/verify"}),
    close_routes=frozenset({"/close_session"}),
)

MULTI_TURN = SessionSpec(
    name="example_multi_turn_gymnasium",
    server_class="resources_servers.example_multi_turn_gymnasium.app:ExampleMultiTurnEnv",
    # its state is the follow-up count in session_turns (session_state stays empty); a terminal
    # /step drops it (Gym's close_session), which ends the session
    state_attr="session_turns",
    codec=MultiTurnCodec(),
    open_routes=frozenset({"/reset"}),
    mutate_routes=frozenset({"/step"}),
    close_routes=frozenset({"/close"}),
)

WORKPLACE_ASSISTANT = SessionSpec(
    name="workplace_assistant",
    server_class="resources_servers.workplace_assistant.app:WorkbenchResourcesServer",
    state_attr="session_id_to_tool_env",
    codec=WorkplaceAssistantCodec(),
    open_routes=frozenset({"/seed_session"}),
    # every tool is a POST /<tool name> (a catch-all route): strict makes each a mutation
    mutate_routes=frozenset(),
    close_routes=frozenset({"/verify"}),  # Gym's verify pops the session
)

INDIRECT_PROMPT_INJECTION = SessionSpec(
    name="indirect_prompt_injection",
    server_class="resources_servers.indirect_prompt_injection.app:IPIResourcesServer",
    state_attr="session_id_to_env",
    codec=JsonEnvironmentCodec("nemo-gym-ipi-env-v1"),
    open_routes=frozenset({"/seed_session"}),
    mutate_routes=frozenset(),  # every tool is a POST /<tool name> (a catch-all route)
    close_routes=frozenset({"/verify"}),  # Gym's verify pops the session
)

BUILTIN_SPECS: tuple[SessionSpec, ...] = (
    BLACKJACK,
    WORDLE,
    COUNTER,
    MULTI_TURN,
    WORKPLACE_ASSISTANT,
    INDIRECT_PROMPT_INJECTION,
)


def gym_version() -> str | None:
    """The installed ``nemo-gym`` version (``None`` when it is not installed)."""
    try:
        return metadata.version("nemo-gym")
    except metadata.PackageNotFoundError:
        return None


def _class_names(server: Any) -> list[str]:
    return [f"{cls.__module__}:{cls.__qualname__}" for cls in type(server).__mro__]


def spec_for(server: Any, specs: Iterable[SessionSpec] = BUILTIN_SPECS) -> SessionSpec | None:
    """The spec of ``server``'s class (or its nearest base class that has one), if its Gym
    version is one the spec was written for; ``None`` means restart-only."""
    names = _class_names(server)
    by_class = {spec.server_class: spec for spec in specs}
    for name in names:
        spec = by_class.get(name)
        if spec is None:
            continue
        version = gym_version()
        if version not in spec.gym_versions:
            _LOG.warning(
                "nemo-gym %s is not a version the %s spec was written for (%s): restart-only",
                version,
                spec.name,
                ", ".join(spec.gym_versions),
            )
            return None
        return spec
    return None
