"""Agreement checks between one execution's components, used by the recovery reader.

Pure functions over member-index references (``MemberRef.refs``): whether the resources
revisions an agent boundary names match the snapshots of the named resources instances, and
whether the model lineage ends at the boundary's last committed call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["RESOURCE_KINDS", "lineage_past_boundary", "resources_disagree"]

RESOURCE_KINDS = frozenset({"resources", "environment"})


def resources_disagree(
    wanted: Any, have: Mapping[str, Mapping[str, int]], instances: Mapping[str, int]
) -> str | None:
    """Why the revisions a boundary names (``{instance: {session: revision}}``) do not match the
    resources components' snapshots of the same execution, or ``None`` when they all do."""
    if not wanted:
        return None
    if not isinstance(wanted, dict):
        return "agent boundary names resources in an unknown form"
    for instance, sessions in sorted(wanted.items()):
        count = instances.get(instance, 0)
        if count == 0:
            return f"resources instance {instance!r} is not in the checkpoint"
        if count > 1:
            return f"resources instance {instance!r} is ambiguous (a resources and an environment component)"
        if not isinstance(sessions, dict):
            return f"agent boundary names resources instance {instance!r} in an unknown form"
        held = have.get(instance, {})
        for session, revision in sorted(sessions.items()):
            if held.get(session) != revision:
                found = "missing" if session not in held else f"at revision {held[session]}"
                return (
                    f"resources session {session!r} of instance {instance!r}: boundary needs revision "
                    f"{revision}, snapshot is {found}"
                )
    return None


def lineage_past_boundary(calls: Mapping[str, Mapping[str, Any]], last: Any) -> list[str]:
    """Calls of the lineage past the boundary's last committed call ``last``.

    The delivered lineage must end at ``last``. Beyond it only *cut* calls (``refs.cut`` set:
    a durable prefix or a completion held during the checkpoint) whose parent is ``last`` may
    follow: attempt N+1 re-issues them under the same id and continues from the cut. A
    delivered call past ``last`` means the agent's boundary lags behind work it consumed.
    """
    committed: set[str] = set()
    cursor = last
    while isinstance(cursor, str) and cursor in calls and cursor not in committed:
        committed.add(cursor)
        cursor = calls[cursor].get("parent")
    return sorted(
        call_id
        for call_id, refs in calls.items()
        if call_id not in committed and (refs.get("cut") is None or refs.get("parent") != last)
    )
