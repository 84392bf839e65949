"""Session-state codecs of the resources participant: state to bytes and back, never pickle."""

from __future__ import annotations

import json
from typing import Any, Protocol, runtime_checkable

__all__ = ["JsonCodec", "StateCodec"]


@runtime_checkable
class StateCodec(Protocol):
    """Encodes a session's state to bytes and back (never pickle: restored bytes are data)."""

    @property
    def name(self) -> str: ...

    def encode(self, state: Any) -> bytes: ...

    def decode(self, data: bytes) -> Any: ...


class JsonCodec:
    """Canonical JSON (sorted keys, no NaN): for states made of dicts, lists, strings, numbers."""

    name = "json"

    def encode(self, state: Any) -> bytes:
        return json.dumps(state, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()

    def decode(self, data: bytes) -> Any:
        return json.loads(data)
