"""Object names inside an archive prefix that layers above may need without loading pyarrow."""

from __future__ import annotations

__all__ = ["MANIFEST_NAME"]

MANIFEST_NAME = "manifest.json"
"""The component manifest's name under an archive prefix (written last, create-only)."""
