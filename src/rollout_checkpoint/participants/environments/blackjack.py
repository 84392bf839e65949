"""A Blackjack-style card game: several hands per episode from one shuffled deck.

The state is everything the next draw depends on: the remaining deck in order, the hands, the
score and the RNG state (SplitMix64, one integer) that shuffles the next deck when this one runs
low. A game restored from a snapshot deals exactly the cards the uninterrupted game deals.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import JsonValue

from ...errors import InvalidArgumentError
from ...protocol import CheckpointMode
from ._base import MASK64, CheckedJsonCodec, splitmix64

__all__ = ["BlackjackCodec", "BlackjackEnvironment"]

STAND, HIT = 0, 1
_KEYS = frozenset({"deck", "rng", "player", "dealer", "hand", "hands", "wins", "losses", "pushes", "done"})
_RESHUFFLE_BELOW = 15


def _value(cards: list[int]) -> int:
    total, aces = 0, 0
    for card in cards:
        rank = card % 13  # 0 = ace, 1..9 = two..ten, 10..12 = faces
        if rank == 0:
            total, aces = total + 11, aces + 1
        else:
            total += min(rank + 1, 10)
    while total > 21 and aces:
        total, aces = total - 10, aces - 1
    return total


def _shuffled(rng: int) -> tuple[list[int], int]:
    deck = list(range(52))
    for i in range(51, 0, -1):  # Fisher-Yates
        rng, out = splitmix64(rng)
        j = out % (i + 1)
        deck[i], deck[j] = deck[j], deck[i]
    return deck, rng


class BlackjackCodec(CheckedJsonCodec):
    """Canonical JSON of a Blackjack state; decode checks every field and the card multiset."""

    name = "blackjack-v1"
    keys = _KEYS
    check = staticmethod(lambda state: _check(state))


def _check(state: Any) -> None:
    if not isinstance(state, dict) or set(state) != _KEYS:
        raise ValueError("not a blackjack state")
    cards = [*state["deck"], *state["player"], *state["dealer"]]
    if not all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c < 52 for c in cards):
        raise ValueError("cards must be integers 0..51")
    if len(set(cards)) != len(cards):
        raise ValueError("a card appears twice")
    if not isinstance(state["rng"], int) or not 0 <= state["rng"] <= MASK64:
        raise ValueError("rng must be a 64-bit unsigned integer")
    for key in ("hand", "hands", "wins", "losses", "pushes"):
        if not isinstance(state[key], int) or isinstance(state[key], bool) or state[key] < 0:
            raise ValueError(f"{key} must be a non-negative integer")
    if not isinstance(state["done"], bool):
        raise ValueError("done must be a boolean")


class BlackjackEnvironment:
    """Hit (action 1) or stand (action 0); the dealer draws to 17; ``hands`` hands per episode."""

    name = "blackjack"
    mode: CheckpointMode = "exported"
    actions = 2

    def __init__(self, hands: int = 3) -> None:
        if hands < 1:
            raise ValueError("hands must be >= 1")
        self.hands = hands
        self.codec = BlackjackCodec()

    def reset(self, seed: int) -> dict[str, Any]:
        deck, rng = _shuffled(seed & MASK64)
        state: dict[str, Any] = {
            "deck": deck,
            "rng": rng,
            "player": [],
            "dealer": [],
            "hand": 0,
            "hands": self.hands,
            "wins": 0,
            "losses": 0,
            "pushes": 0,
            "done": False,
        }
        return _deal(state)

    def step(self, state: Mapping[str, Any], action: int) -> dict[str, Any]:
        new = {**state, "deck": list(state["deck"]), "player": list(state["player"])}
        new["dealer"] = list(state["dealer"])
        if new["done"]:
            raise InvalidArgumentError("the episode is over: close the session or seed a new one")
        if action % self.actions == HIT:
            new["player"].append(new["deck"].pop(0))
            if _value(new["player"]) > 21:
                new["losses"] += 1
                return _next_hand(new)
            return new
        while _value(new["dealer"]) < 17:
            new["dealer"].append(new["deck"].pop(0))
        player, dealer = _value(new["player"]), _value(new["dealer"])
        if dealer > 21 or player > dealer:
            new["wins"] += 1
        elif player < dealer:
            new["losses"] += 1
        else:
            new["pushes"] += 1
        return _next_hand(new)

    def observe(self, state: Mapping[str, Any]) -> list[int]:
        upcard = _value(state["dealer"][:1]) if state["dealer"] else 0
        return [_value(state["player"]), upcard, state["hand"], len(state["deck"])]

    def done(self, state: Mapping[str, Any]) -> bool:
        return bool(state["done"])

    def reward(self, state: Mapping[str, Any]) -> float:
        return float(state["wins"] - state["losses"])

    def summary(self, state: Mapping[str, Any]) -> Mapping[str, JsonValue]:
        return {k: state[k] for k in ("hand", "wins", "losses", "pushes", "done", "rng")} | {
            "deck_left": len(state["deck"])
        }


def _next_hand(state: dict[str, Any]) -> dict[str, Any]:
    state["hand"] += 1
    state["player"], state["dealer"] = [], []
    if state["hand"] >= state["hands"]:
        state["done"] = True
        return state
    return _deal(state)


def _deal(state: dict[str, Any]) -> dict[str, Any]:
    if len(state["deck"]) < _RESHUFFLE_BELOW:
        state["deck"], state["rng"] = _shuffled(state["rng"])
    deck = state["deck"]
    state["player"] = [deck.pop(0), deck.pop(0)]
    state["dealer"] = [deck.pop(0), deck.pop(0)]
    return state
