"""Reference environments: logic plus a state codec, served by a resources participant.

* :class:`BlackjackEnvironment` (codec ``blackjack-v1``): deck order and RNG state in the
  snapshot, so a restored game deals the same cards;
* :class:`InventoryEnvironment` (codec ``inventory-v1``): counts with a revision per operation;
* :class:`LiveStreamEnvironment`: deliberately ``restart_only`` (its state is a live generator).

:func:`make_participant` builds the resources participant that serves one of them.
"""

from __future__ import annotations

from ._base import Environment, make_participant, splitmix64
from .blackjack import BlackjackCodec, BlackjackEnvironment
from .inventory import InventoryCodec, InventoryEnvironment
from .live_stream import LiveStreamEnvironment

__all__ = [
    "BlackjackCodec",
    "BlackjackEnvironment",
    "Environment",
    "InventoryCodec",
    "InventoryEnvironment",
    "LiveStreamEnvironment",
    "make_participant",
    "reference_environments",
    "splitmix64",
]


def reference_environments() -> list[Environment]:
    """One of each reference environment, with default sizes."""
    return [BlackjackEnvironment(), InventoryEnvironment(), LiveStreamEnvironment()]
