"""A test-only Gym server (imported by a server process through PYTHONPATH): Gym's blackjack whose
``/step`` sleeps ``slow_step`` seconds (a field of the request) before Gym's own step runs. With
``mark`` (a path, another field) it creates ``<mark>.started`` when the step begins, then waits
(instead of sleeping, 60 s at most) until the test creates ``<mark>.go``, and creates
``<mark>.ended`` once Gym's step returned: a test waits on those moments, not on a clock."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from rollout_checkpoint.integrations.nemo_gym.seeded import SeededBlackjackEnv


class SlowStepBlackjackEnv(SeededBlackjackEnv):
    async def step(self, action: Any, metadata: dict[str, Any], session_id: str | None = None) -> Any:
        mark = metadata.get("mark")
        if mark:
            Path(f"{mark}.started").touch()
            end = asyncio.get_running_loop().time() + 60
            while not Path(f"{mark}.go").exists() and asyncio.get_running_loop().time() < end:
                await asyncio.sleep(0.02)
        else:
            await asyncio.sleep(float(metadata.get("slow_step", 0)))
        result = await super().step(action, metadata, session_id)
        if mark:
            Path(f"{mark}.ended").touch()
        return result
