"""Lazy package attributes (PEP 562): a package maps each public name to the module that
defines it, and that module is imported on first access. It keeps ``import rollout_checkpoint``
light: the S3 stack, the CLI libraries and ``pyarrow.parquet`` load only where they are used."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any

__all__ = ["lazy_getattr"]


def lazy_getattr(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``: ``exports`` maps a name to a module path
    relative to the package; the value is cached on the package after the first access."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(module, package), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
