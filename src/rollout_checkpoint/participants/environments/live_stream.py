"""A deliberately restart-only environment: its state holds a live generator.

The session state is a running Python generator (a stand-in for a subprocess, a socket or a
remote sandbox): it advances in place and cannot be encoded, so the environment declares
``restart_only`` and its participant never exports it. A checkpoint classifies its rollouts
``fresh_dispatch``; they rerun from their input, which reproduces the same episode.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import JsonValue

from ...errors import InvalidArgumentError
from ...protocol import CheckpointMode
from ..codecs import StateCodec
from ._base import splitmix64

__all__ = ["LiveStreamEnvironment", "StreamState"]


def _stream(seed: int) -> Iterator[int]:
    rng = seed
    while True:
        rng, out = splitmix64(rng)
        yield int(out % 10)


@dataclass
class StreamState:
    """Live state: the generator is advanced by every step (not a value that can be copied)."""

    stream: Iterator[int]
    total: int = 0
    steps: int = 0
    limit: int = 6


class LiveStreamEnvironment:
    """Each step draws the next number from the live stream; action 1 keeps it, 0 skips it."""

    name = "live-stream"
    mode: CheckpointMode = "restart_only"
    actions = 2
    codec: StateCodec | None = None

    def __init__(self, limit: int = 6) -> None:
        self.limit = limit

    def reset(self, seed: int) -> StreamState:
        return StreamState(stream=_stream(seed), limit=self.limit)

    def step(self, state: StreamState, action: int) -> StreamState:
        if self.done(state):
            raise InvalidArgumentError("the episode is over: close the session or seed a new one")
        value = next(state.stream)  # advances the live generator in place
        state.total += value if action % 2 == 1 else 0
        state.steps += 1
        return state

    def observe(self, state: StreamState) -> list[int]:
        return [state.total, state.steps]

    def done(self, state: StreamState) -> bool:
        return state.steps >= state.limit

    def reward(self, state: StreamState) -> float:
        return float(state.total)

    def summary(self, state: Any) -> Mapping[str, JsonValue]:
        return {"total": state.total, "steps": state.steps}
