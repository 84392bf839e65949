"""A counter/inventory environment: stock counts moved toward a target, one revision per op.

Every applied operation bumps ``ops``, the environment's own revision, which equals the
resources session's revision (both start at 0 and move together), so a snapshot carries the
revision it was taken at and a restored session continues from exactly that count.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import JsonValue

from ...errors import InvalidArgumentError
from ...protocol import CheckpointMode
from ._base import CheckedJsonCodec, splitmix64

__all__ = ["ITEMS", "InventoryCodec", "InventoryEnvironment"]

ITEMS: tuple[str, ...] = ("apples", "bolts", "cables")
_KEYS = frozenset({"items", "target", "capacity", "ops", "rejected", "max_ops", "done"})


class InventoryCodec(CheckedJsonCodec):
    """Canonical JSON of an inventory state; decode checks counts, capacity and the revision."""

    name = "inventory-v1"
    keys = _KEYS
    check = staticmethod(lambda state: _check(state))


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check(state: Any) -> None:
    if not isinstance(state, dict) or set(state) != _KEYS:
        raise ValueError("not an inventory state")
    for key in ("items", "target"):
        counts = state[key]
        if not isinstance(counts, dict) or set(counts) != set(ITEMS) or not all(map(_count, counts.values())):
            raise ValueError(f"{key} must map {list(ITEMS)} to non-negative integers")
    if not all(_count(state[k]) for k in ("capacity", "ops", "rejected", "max_ops")):
        raise ValueError("capacity, ops, rejected and max_ops must be non-negative integers")
    if sum(state["items"].values()) > state["capacity"]:
        raise ValueError("stock exceeds capacity")
    if not isinstance(state["done"], bool):
        raise ValueError("done must be a boolean")


class InventoryEnvironment:
    """Action ``a``: add (even) or remove (odd) one of ``ITEMS[a // 2 % 3]``. A remove from an
    empty bin or an add beyond capacity is rejected (counted, still an op). Done when the stock
    equals the target or after ``max_ops`` operations."""

    name = "inventory"
    mode: CheckpointMode = "exported"
    actions = 2 * len(ITEMS)

    def __init__(self, capacity: int = 12, max_ops: int = 64) -> None:
        self.capacity = capacity
        self.max_ops = max_ops
        self.codec = InventoryCodec()

    def reset(self, seed: int) -> dict[str, Any]:
        rng, target = seed, {}
        for item in ITEMS:
            rng, out = splitmix64(rng)
            target[item] = int(out % 4)
        target[ITEMS[0]] = max(1, target[ITEMS[0]])  # never done before the first operation
        return {
            "items": dict.fromkeys(ITEMS, 0),
            "target": target,
            "capacity": self.capacity,
            "ops": 0,
            "rejected": 0,
            "max_ops": self.max_ops,
            "done": False,
        }

    def step(self, state: Mapping[str, Any], action: int) -> dict[str, Any]:
        if state["done"]:
            raise InvalidArgumentError("the episode is over: close the session or seed a new one")
        new = {**state, "items": dict(state["items"])}
        item = ITEMS[(action // 2) % len(ITEMS)]
        if action % 2 == 0 and sum(new["items"].values()) < new["capacity"]:
            new["items"][item] += 1
        elif action % 2 == 1 and new["items"][item] > 0:
            new["items"][item] -= 1
        else:
            new["rejected"] += 1
        new["ops"] += 1
        new["done"] = new["items"] == new["target"] or new["ops"] >= new["max_ops"]
        return new

    def observe(self, state: Mapping[str, Any]) -> list[int]:
        return [*(state["items"][i] for i in ITEMS), *(state["target"][i] for i in ITEMS), state["ops"]]

    def done(self, state: Mapping[str, Any]) -> bool:
        return bool(state["done"])

    def reward(self, state: Mapping[str, Any]) -> float:
        return -float(sum(abs(state["items"][i] - state["target"][i]) for i in ITEMS))

    def summary(self, state: Mapping[str, Any]) -> Mapping[str, JsonValue]:
        return {
            "items": dict(state["items"]),
            "ops": state["ops"],
            "rejected": state["rejected"],
            "done": state["done"],
        }
