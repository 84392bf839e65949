"""A store that forwards every operation to another one: the base of observing wrappers."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import BinaryIO

from ._base import ObjectInfo, ObjectStore, PutResult, StoreCapabilities

__all__ = ["DelegatingStore"]


class DelegatingStore(ObjectStore):
    """Forwards every operation, capabilities and the atomic-commit check to ``inner``.

    Subclasses override only what they observe (counting, fault injection). Everything else,
    streaming writes included, reaches the inner backend unchanged, so a wrapper never turns
    a streamed object into one held in memory.
    """

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.url = inner.url

    @property
    def capabilities(self) -> StoreCapabilities:  # type: ignore[override]
        return self.inner.capabilities

    def put(self, key: str, data: bytes) -> ObjectInfo:
        return self.inner.put(key, data)

    def open_write(self, key: str) -> AbstractContextManager[BinaryIO]:
        return self.inner.open_write(key)

    def get(self, key: str) -> bytes:
        return self.inner.get(key)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        return self.inner.get_range(key, start, end)

    def open_read(self, key: str) -> BinaryIO:
        return self.inner.open_read(key)

    def stat(self, key: str) -> ObjectInfo:
        return self.inner.stat(key)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def put_if_absent(self, key: str, data: bytes) -> PutResult:
        return self.inner.put_if_absent(key, data)

    def put_if_match(self, key: str, data: bytes, version: str) -> ObjectInfo:
        return self.inner.put_if_match(key, data, version)

    def remove_empty_folders(self, prefix: str) -> None:
        self.inner.remove_empty_folders(prefix)

    def require_atomic_commits(self, *, accept_risk: bool = False) -> None:
        self.inner.require_atomic_commits(accept_risk=accept_risk)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"
