"""What a demo run showed, kept apart from whether it was correct.

A run is *correct* when every rollout completed, no result was lost, no completed model or tool
call was repeated and the results equal an uninterrupted run of the same seed: that alone is
``ok`` and the exit status. What the run *exercised* (the crash, rollouts continued from their
boundary, generations continued from their cut) depends on timing (a loaded machine may finish
every generation before a checkpoint cuts one), so it is reported on its own:
``demonstrated`` maps each feature to true or false, and ``not_demonstrated`` gives the reason
for each false one.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..reader import RecoveryPlan

__all__ = ["FEATURES", "continuable_cuts"]

FEATURES = ("crash", "rollouts_continued", "generation_cuts_continued")
"""The features a demo run reports, in the order they appear in ``demonstrated``."""


def continuable_cuts(plan: RecoveryPlan) -> int:
    """Generation cuts in ``plan`` that belong to a rollout it continues: what the demo's crash
    needs in its checkpoint to show a generation continued from its prefix (a cut of a
    restart-only rollout is discarded with its fresh dispatch)."""
    continued = {p.rollout_id for p in plan.continued}
    cuts = 0
    for (kind, _), reader in plan.readers.items():
        if kind == "model":
            for member in reader.members(kind="model_lineage"):
                cut = (member.refs or {}).get("cut")
                cuts += isinstance(cut, Mapping) and member.rollout_id in continued
    return cuts
