"""Build functions that return the wrong thing or raise (``serve`` must say so in one line)."""

from __future__ import annotations

from typing import Any


def returns_a_dict(context: Any) -> dict[str, Any]:
    return {"app": None}


NOT_A_FUNCTION = 42


def raises(context: Any) -> Any:
    raise RuntimeError("the model weights are not where the config says")
