"""The demo workload (``rollout-checkpoint demo``) and the populated deployment the
checkpoint-cycle benchmark times.

* :func:`run_demo` - multi-turn agents on the reference environments and the fake policy model:
  checkpoint while generating, crash, restore, finish, compare with an uninterrupted run;
* :class:`DemoWorld`, :func:`run_rollout` - one in-memory "process" and the agent loop;
* :class:`DemoDeployment` - many rollouts parked at a boundary, created directly, for benchmarks.
"""

from __future__ import annotations

from ._deployment import DemoDeployment
from ._run import DemoReport, run_demo
from ._workload import DemoWorld, Ledger, RolloutSpec, rollout_specs, run_rollout

__all__ = [
    "DemoDeployment",
    "DemoReport",
    "DemoWorld",
    "Ledger",
    "RolloutSpec",
    "rollout_specs",
    "run_demo",
    "run_rollout",
]
