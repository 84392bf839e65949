"""Codecs for the per-session state of NeMo Gym's built-in servers (never pickle).

Each turns one value of a server's session dict into canonical JSON bytes and back, refusing on
decode anything that is not exactly the shape that server keeps (an unknown or missing field, a
wrong type, an RNG state of the wrong size): such a session makes the whole restore fail. The
shapes are those of the Gym version in :data:`~.specs.GYM_VERSION_TESTED`.
"""

from __future__ import annotations

import json
import random
from dataclasses import fields, is_dataclass
from typing import Any

__all__ = [
    "BlackjackCodec",
    "CounterCodec",
    "JsonEnvironmentCodec",
    "MultiTurnCodec",
    "WordleCodec",
    "canonical_json",
]

_MT_WORDS = 625  # Mersenne Twister: 624 state words plus the index


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _load_object(data: bytes, keys: set[str], what: str) -> dict[str, Any]:
    doc = json.loads(data)
    if not isinstance(doc, dict) or set(doc) != keys:
        got = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
        raise ValueError(f"{what} state must have exactly the fields {sorted(keys)}, got {got}")
    return doc


def _str_list(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{what} must be a list of strings")
    return list(value)


def encode_rng(rng: random.Random) -> dict[str, Any]:
    """``random.Random``'s full state (the Mersenne Twister words, the cached Gaussian)."""
    version, words, gauss = rng.getstate()
    return {"version": version, "words": list(words), "gauss_next": gauss}


def decode_rng(doc: Any) -> random.Random:
    if not isinstance(doc, dict) or set(doc) != {"version", "words", "gauss_next"}:
        raise ValueError("rng state must have exactly the fields gauss_next, version, words")
    words = doc["words"]
    if (
        not isinstance(words, list)
        or len(words) != _MT_WORDS
        or not all(type(w) is int and 0 <= w < 2**32 for w in words)
    ):
        raise ValueError(f"rng words must be {_MT_WORDS} integers in [0, 2**32)")
    if doc["version"] != 3:
        raise ValueError(f"rng state version {doc['version']!r} is not 3")
    gauss = doc["gauss_next"]
    if gauss is not None and not isinstance(gauss, float):
        raise ValueError("rng gauss_next must be null or a float")
    rng = random.Random()
    rng.setstate((3, tuple(words), gauss))
    return rng


_RANKS = frozenset(["2", "3", "4", "5", "6", "7", "8", "9", "10", "J", "Q", "K", "A"])


class BlackjackCodec:
    """Gym blackjack's ``{"player": [rank...], "dealer": [rank...], "rng": random.Random}``."""

    name = "nemo-gym-blackjack-v1"

    def encode(self, state: Any) -> bytes:
        if not isinstance(state, dict) or set(state) != {"player", "dealer", "rng"}:
            raise ValueError("blackjack state must be a dict with player, dealer and rng")
        rng = state["rng"]
        if not isinstance(rng, random.Random):
            raise TypeError("blackjack rng must be a random.Random")
        return canonical_json(
            {"player": list(state["player"]), "dealer": list(state["dealer"]), "rng": encode_rng(rng)}
        )

    def decode(self, data: bytes) -> Any:
        doc = _load_object(data, {"player", "dealer", "rng"}, "blackjack")
        hands = {k: _str_list(doc[k], f"blackjack {k}") for k in ("player", "dealer")}
        for name, hand in hands.items():
            if not hand or not set(hand) <= _RANKS:
                raise ValueError(f"blackjack {name} hand must be non-empty ranks")
        return {"player": hands["player"], "dealer": hands["dealer"], "rng": decode_rng(doc["rng"])}


class CounterCodec:
    """``example_session_state_mgmt``: one integer counter per session."""

    name = "nemo-gym-counter-v1"

    def encode(self, state: Any) -> bytes:
        if type(state) is not int:
            raise TypeError("counter state must be an int")
        return canonical_json({"count": state})

    def decode(self, data: bytes) -> Any:
        doc = _load_object(data, {"count"}, "counter")
        if type(doc["count"]) is not int:
            raise ValueError("counter count must be an integer")
        return doc["count"]


_WORDLE_FIELDS = {
    "target_word": str,
    "word_length": int,
    "max_turns": int,
    "turn": int,
    "guesses": list,
    "feedback_history": list,
    "known_greens": dict,
    "known_yellows": set,
    "eliminated_letters": set,
    "game_over": bool,
    "won": bool,
    "total_reward": float,
}


class WordleCodec:
    """Gym wordle's ``WordleGameState`` dataclass (sets as sorted lists, green positions as keys)."""

    name = "nemo-gym-wordle-v1"

    def __init__(self, state_class: type | None = None) -> None:
        self._state_class = state_class

    def _cls(self) -> type:
        if self._state_class is None:
            from resources_servers.wordle.app import WordleGameState

            self._state_class = WordleGameState
        return self._state_class

    def encode(self, state: Any) -> bytes:
        if not is_dataclass(state) or {f.name for f in fields(state)} != set(_WORDLE_FIELDS):
            raise TypeError("wordle state must be a WordleGameState")
        doc: dict[str, Any] = {}
        for name in _WORDLE_FIELDS:
            value = getattr(state, name)
            if isinstance(value, set):
                value = sorted(value)
            elif name == "known_greens":
                value = {str(k): v for k, v in sorted(value.items())}
            doc[name] = value
        return canonical_json(doc)

    def decode(self, data: bytes) -> Any:
        doc = _load_object(data, set(_WORDLE_FIELDS), "wordle")
        kwargs: dict[str, Any] = {}
        for name, kind in _WORDLE_FIELDS.items():
            value = doc[name]
            if kind is set:
                kwargs[name] = set(_str_list(value, f"wordle {name}"))
            elif kind is dict:
                if not isinstance(value, dict) or not all(
                    k.isdigit() and isinstance(v, str) for k, v in value.items()
                ):
                    raise ValueError("wordle known_greens must map positions to letters")
                kwargs[name] = {int(k): v for k, v in value.items()}
            elif kind is float:
                if type(value) not in (int, float):
                    raise ValueError("wordle total_reward must be a number")
                kwargs[name] = float(value)
            elif kind is list:
                if not isinstance(value, list):
                    raise ValueError(f"wordle {name} must be a list")
                kwargs[name] = [list(v) if isinstance(v, list) else v for v in value]
            elif type(value) is not kind:
                raise ValueError(f"wordle {name} must be {kind.__name__}")
            else:
                kwargs[name] = value
        return self._cls()(**kwargs)


class MultiTurnCodec:
    """``example_multi_turn_gymnasium``: the number of follow-ups already sent in the session
    (``session_turns[sid]``; the follow-ups themselves come with every step's body)."""

    name = "nemo-gym-multi-turn-v1"

    def encode(self, state: Any) -> bytes:
        if type(state) is not int or state < 0:
            raise TypeError("multi-turn state must be a non-negative int")
        return canonical_json({"turn": state})

    def decode(self, data: bytes) -> Any:
        doc = _load_object(data, {"turn"}, "multi-turn")
        if type(doc["turn"]) is not int or doc["turn"] < 0:
            raise ValueError("multi-turn turn must be a non-negative integer")
        return doc["turn"]


def _check_json(value: Any, what: str, depth: int = 0) -> None:
    if depth > 64:
        raise ValueError(f"{what} is nested too deeply")
    if value is None or type(value) in (str, int, bool):
        return
    if type(value) is float:
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{what} holds a non-finite number")
        return
    if type(value) is list:
        for item in value:
            _check_json(item, what, depth + 1)
        return
    if type(value) is dict:
        for key, item in value.items():
            if type(key) is not str:
                raise ValueError(f"{what} has a key that is not a string")
            _check_json(item, what, depth + 1)
        return
    raise TypeError(f"{what} holds a {type(value).__name__}, not JSON")


class JsonEnvironmentCodec:
    """A session that is one JSON object seeded from the task and mutated by the tools (Gym's
    ``indirect_prompt_injection``: ``session_id_to_env[sid]``, a deep copy of the task row's
    ``environment``). Encodes compact JSON **in the dict's own key order** (not sorted: the tools
    answer ``json.dumps`` of parts of it, so a restored session must iterate its keys as the
    original did); refuses anything that is not exactly JSON (a tuple, a set, a non-string key,
    NaN), which would not come back as it went in."""

    def __init__(self, name: str) -> None:
        self.name = name

    def encode(self, state: Any) -> bytes:
        if type(state) is not dict:
            raise TypeError(f"{self.name} state must be a dict")
        _check_json(state, f"{self.name} state")
        return json.dumps(state, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()

    def decode(self, data: bytes) -> Any:
        doc = json.loads(data)
        if type(doc) is not dict:
            raise ValueError(f"{self.name} state must be a JSON object")
        return doc
