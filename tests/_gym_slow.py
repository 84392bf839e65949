"""A test-only Gym server (imported by a server process through PYTHONPATH): Gym's blackjack whose
``/step`` sleeps ``slow_step`` seconds (a field of the request) before Gym's own step runs."""

from __future__ import annotations

import asyncio
from typing import Any

from rollout_checkpoint.integrations.nemo_gym.seeded import SeededBlackjackEnv


class SlowStepBlackjackEnv(SeededBlackjackEnv):
    async def step(self, action: Any, metadata: dict[str, Any], session_id: str | None = None) -> Any:
        await asyncio.sleep(float(metadata.get("slow_step", 0)))
        return await super().step(action, metadata, session_id)
