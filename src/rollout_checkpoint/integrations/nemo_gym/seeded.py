"""Gym's blackjack with reproducible deals, so a resumed run can be compared with an
uninterrupted one.

Gym's ``BlackjackEnv.reset`` draws from ``random.Random()`` seeded by the operating system, so
two runs never deal the same cards. :class:`SeededBlackjackEnv` changes only that: when the
task row carries an integer ``seed`` (Gym hands the row's extra fields to ``reset`` as
``metadata``), Gym's own ``reset`` runs with its module's ``random.Random`` answering a
generator seeded by it; the game logic, the step, the session dict and the RNG kept in it are
Gym's, unchanged. Gym's ``reset`` does not await between creating the generator and dealing, so
no other request can observe the swap.
"""

from __future__ import annotations

import random
import sys
from typing import Any

from resources_servers.blackjack.app import BlackjackEnv

__all__ = ["SeededBlackjackEnv"]


class _SeededRandomModule:
    def __init__(self, seed: int) -> None:
        self._seed = seed

    def Random(self) -> random.Random:
        return random.Random(self._seed)


class SeededBlackjackEnv(BlackjackEnv):
    """See the module docstring."""

    async def reset(
        self, metadata: dict[str, Any], session_id: str | None = None
    ) -> tuple[str | None, dict[str, Any]]:
        seed = metadata.get("seed")
        if type(seed) is not int:
            unseeded: tuple[str | None, dict[str, Any]] = await super().reset(metadata, session_id)
            return unseeded
        module: Any = sys.modules[BlackjackEnv.__module__]
        original = module.random
        module.random = _SeededRandomModule(seed)
        try:
            seeded: tuple[str | None, dict[str, Any]] = await super().reset(metadata, session_id)
            return seeded
        finally:
            module.random = original
