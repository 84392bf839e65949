"""What a reference environment is: pure game logic, a codec for its state, a participant."""

from __future__ import annotations

import abc
import json
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from pydantic import JsonValue

from ...protocol import CheckpointMode
from ..codecs import StateCodec
from ..resources import ResourcesParticipant

__all__ = [
    "MASK64",
    "CheckedJsonCodec",
    "Environment",
    "canonical_json",
    "make_participant",
    "splitmix64",
    "strict_json",
]

MASK64 = (1 << 64) - 1


def splitmix64(state: int) -> tuple[int, int]:
    """One step of SplitMix64: ``(new_state, output)``. The whole RNG state is one integer, so
    it travels in a session snapshot and a restored game draws exactly what it would have."""
    state = (state + 0x9E3779B97F4A7C15) & MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return state, z ^ (z >> 31)


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def strict_json(data: bytes, keys: frozenset[str]) -> dict[str, Any]:
    """Parse a JSON object with exactly ``keys`` (``ValueError`` otherwise)."""
    value = json.loads(data)
    if not isinstance(value, dict):
        raise ValueError("state is not a JSON object")
    if set(value) != keys:
        raise ValueError(f"state keys {sorted(value)} are not {sorted(keys)}")
    return value


class CheckedJsonCodec(abc.ABC):
    """A state codec: canonical JSON of an object with exactly ``keys``, checked both ways by
    the subclass's ``check`` (which raises ``ValueError`` for a malformed state)."""

    name: str
    keys: frozenset[str]

    @staticmethod
    @abc.abstractmethod
    def check(state: Any) -> None:
        """Raise ``ValueError`` if ``state`` is not a well-formed state of this environment."""

    def encode(self, state: Any) -> bytes:
        self.check(state)
        return canonical_json(state)

    def decode(self, data: bytes) -> Any:
        state = strict_json(data, self.keys)
        self.check(state)
        return state


@runtime_checkable
class Environment(Protocol):
    """A reference environment: deterministic logic over a state value.

    ``step`` is pure (returns a new state; the resources participant applies it under the
    session lock). ``codec`` is ``None`` for an environment that cannot export its state;
    its ``mode`` is then ``restart_only``.
    """

    @property
    def name(self) -> str: ...

    @property
    def mode(self) -> CheckpointMode: ...

    @property
    def actions(self) -> int: ...

    @property
    def codec(self) -> StateCodec | None: ...

    def reset(self, seed: int) -> Any: ...

    def step(self, state: Any, action: int) -> Any: ...

    def observe(self, state: Any) -> list[int]: ...

    def done(self, state: Any) -> bool: ...

    def reward(self, state: Any) -> float: ...

    def summary(self, state: Any) -> Mapping[str, JsonValue]: ...


def make_participant(env: Environment, instance: str | None = None, **options: Any) -> ResourcesParticipant:
    """A resources participant for ``env``: exported with its codec, or restart-only."""
    return ResourcesParticipant(
        instance or env.name, kind="resources", mode=env.mode, codec=env.codec, **options
    )
