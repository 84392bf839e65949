"""Object stores: a small interface over fsspec with conditional puts and capability flags.

Open one from a URL with :func:`open_store`: a plain path or ``file://`` (:class:`LocalStore`),
``memory://`` (:class:`MemoryStore`), ``s3://bucket/prefix`` (:class:`S3Store`), or any other
fsspec protocol (:class:`FsspecStore`, whose conditional puts are not atomic).
"""

from __future__ import annotations

from typing import Any

from ._base import ObjectInfo, ObjectStore, PutResult, StoreCapabilities
from ._fsspec import FsspecStore, MemoryStore
from ._local import LocalStore
from ._open import open_store

__all__ = [
    "FsspecStore",
    "LocalStore",
    "MemoryStore",
    "ObjectInfo",
    "ObjectStore",
    "PutResult",
    "S3Store",
    "StoreCapabilities",
    "open_store",
]


def __getattr__(name: str) -> Any:
    # s3fs/aiobotocore are imported only when S3 is used.
    if name == "S3Store":
        from ._s3 import S3Store

        return S3Store
    raise AttributeError(name)
