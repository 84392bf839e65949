"""Any fsspec filesystem as a store; conditional puts are emulated (not atomic) unless a
subclass overrides them with a primitive the backend enforces."""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any, BinaryIO, cast

import fsspec

from ..errors import ObjectNotFoundError, StoreError
from ._base import ObjectInfo, ObjectStore, PutResult, StoreCapabilities
from ._errors import mapped_errors

__all__ = ["FsspecStore", "MemoryStore"]


class FsspecStore(ObjectStore):
    """Objects under ``root`` of an fsspec filesystem.

    .. warning::
       ``put_if_absent`` and ``put_if_match`` here are *check, then write*: racy. The
       capability flags say so, and :meth:`require_atomic_commits` refuses publication
       unless the caller accepts the risk.
    """

    capabilities = StoreCapabilities(atomic_put_if_absent=False, atomic_put_if_match=False)
    write_block_size: int | None = None
    """Buffer (and multipart part) size of :meth:`open_write` files; ``None``: fsspec's default."""

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str, url: str) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self.url = url.rstrip("/")

    def _path(self, key: str) -> str:
        return f"{self.root}/{self._check_key(key)}" if self.root else self._check_key(key)

    def _key_of(self, path: str) -> str:
        path = path.lstrip("/") if not self.root.startswith("/") else path
        root = self.root.lstrip("/") if not self.root.startswith("/") else self.root
        return path[len(root) + 1 :] if root else path

    @staticmethod
    def _version_of(info: dict[str, Any], data: bytes | None = None) -> str | None:
        for field in ("ETag", "etag", "generation", "version_id", "VersionId"):
            if info.get(field):
                return str(info[field]).strip('"')
        if data is not None:
            return hashlib.sha256(data).hexdigest()
        return None

    def _missing(self, key: str) -> ObjectNotFoundError:
        return ObjectNotFoundError(f"{self.url}/{key} does not exist", key=key)

    # -- plain ------------------------------------------------------------------------------
    @mapped_errors
    def put(self, key: str, data: bytes) -> ObjectInfo:
        path = self._path(key)
        try:
            self.fs.pipe_file(path, data)
        except FileNotFoundError:
            # Filesystems with real directories (fsspec "file" without auto_mkdir) need the parent.
            self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            self.fs.pipe_file(path, data)
        return self.stat(key)

    @mapped_errors
    def get(self, key: str) -> bytes:
        try:
            return cast(bytes, self.fs.cat_file(self._path(key)))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise self._missing(key) from None

    @mapped_errors
    def get_range(self, key: str, start: int, end: int) -> bytes:
        if start < 0 or end < start:
            raise StoreError(f"invalid byte range [{start}, {end})", key=key)
        if end == start:
            self.stat(key)  # a missing object is still an error, as on every other backend
            return b""
        try:
            return cast(bytes, self.fs.cat_file(self._path(key), start=start, end=end))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise self._missing(key) from None

    @mapped_errors
    def open_read(self, key: str) -> BinaryIO:
        try:
            return cast(BinaryIO, self.fs.open(self._path(key), "rb"))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise self._missing(key) from None

    def _open_for_write(self, path: str) -> Any:
        if self.write_block_size is None:
            return self.fs.open(path, "wb")
        return self.fs.open(path, "wb", block_size=self.write_block_size)

    @mapped_errors
    def open_write(self, key: str) -> AbstractContextManager[BinaryIO]:
        """The filesystem's buffered writer (on S3 a multipart upload once the data outgrows
        :attr:`write_block_size`). A clean exit closes it, which finishes the upload; an exception
        calls ``discard()`` (s3fs aborts the multipart upload) instead of ``close()``, because
        fsspec files *commit* on close, also from ``__exit__`` and from ``__del__``."""
        return self._stream_write(self._path(key))

    @contextlib.contextmanager
    def _stream_write(self, path: str) -> Iterator[BinaryIO]:
        try:
            fh = self._open_for_write(path)
        except FileNotFoundError:
            self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            fh = self._open_for_write(path)
        try:
            yield cast(BinaryIO, fh)
        except BaseException:
            with contextlib.suppress(Exception):
                fh.discard()
            with contextlib.suppress(Exception):
                fh.closed = True  # so that no later close() or __del__ commits the partial data
            raise
        fh.close()

    @mapped_errors
    def stat(self, key: str) -> ObjectInfo:
        try:
            info = self.fs.info(self._path(key))
        except (FileNotFoundError, NotADirectoryError):
            raise self._missing(key) from None
        if info.get("type") == "directory":
            raise self._missing(key)
        version = self._version_of(info)
        if version is None:
            version = self._version_of(info, self.get(key))
        return ObjectInfo(key=key, size=int(info["size"]), version=version)

    @mapped_errors
    def list(self, prefix: str = "") -> list[ObjectInfo]:
        self._check_prefix(prefix)
        folder = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        base = f"{self.root}/{folder}" if folder else self.root
        self.fs.invalidate_cache()
        try:
            found = self.fs.find(base, detail=True, on_error="raise")
        except FileNotFoundError:
            return []
        out = []
        for path, info in found.items():
            if info.get("type") == "directory":
                continue
            key = self._key_of(path)
            if key.startswith(prefix):
                out.append(ObjectInfo(key=key, size=int(info["size"]), version=self._version_of(info)))
        out.sort(key=lambda i: i.key)
        return out

    @mapped_errors
    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self._path(key))

    # -- conditional (emulated) ---------------------------------------------------------------
    @mapped_errors
    def put_if_absent(self, key: str, data: bytes) -> PutResult:
        if self.exists(key):
            return self._resolve_existing(key, data)
        return PutResult(info=self.put(key, data), created=True)

    @mapped_errors
    def put_if_match(self, key: str, data: bytes, version: str) -> ObjectInfo:
        current = self.stat(key)
        if current.version != version:
            return self._resolve_changed(key, data, version, current.version)
        return self.put(key, data)


_MEMORY_LOCK = threading.RLock()


class MemoryStore(FsspecStore):
    """fsspec's process-wide ``memory://`` filesystem; conditional puts are atomic within the
    process because every conditional put holds one process-wide lock."""

    capabilities = StoreCapabilities(atomic_put_if_absent=True, atomic_put_if_match=True)

    def __init__(self, root: str = "") -> None:
        fs = fsspec.filesystem("memory")
        root = "/" + root.strip("/") if root.strip("/") else ""
        super().__init__(fs, root, f"memory://{root}")
        if not root:
            self.url = "memory://"  # FsspecStore strips trailing "/": keep the scheme whole

    def _key_of(self, path: str) -> str:
        path = "/" + path.lstrip("/")
        return path[len(self.root) + 1 :] if self.root else path.lstrip("/")

    def _path(self, key: str) -> str:
        return f"{self.root}/{self._check_key(key)}"

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        self._check_prefix(prefix)
        folder = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        base = f"{self.root}/{folder}" if folder else (self.root or "/")
        try:
            found = self.fs.find(base, detail=True, on_error="raise")
        except FileNotFoundError:
            return []
        out = []
        for path, info in found.items():
            key = self._key_of(path)
            if key.startswith(prefix) and info.get("type") != "directory":
                try:
                    data = cast(bytes, self.fs.cat_file(path))
                except FileNotFoundError:
                    continue  # deleted while listing
                # Same token as stat() so a listed version can feed put_if_match; cheap in memory.
                out.append(ObjectInfo(key=key, size=len(data), version=hashlib.sha256(data).hexdigest()))
        out.sort(key=lambda i: i.key)
        return out

    def stat(self, key: str) -> ObjectInfo:
        data = self.get(key)
        return ObjectInfo(key=key, size=len(data), version=hashlib.sha256(data).hexdigest())

    def open_write(self, key: str) -> AbstractContextManager[BinaryIO]:
        """Buffered, then one :meth:`put` on a clean exit (the store is memory anyway, and a
        fsspec ``MemoryFile`` would commit partial data if it were garbage-collected unclosed)."""
        return ObjectStore.open_write(self, key)

    def put(self, key: str, data: bytes) -> ObjectInfo:
        with _MEMORY_LOCK:
            self.fs.pipe_file(self._path(key), bytes(data))
        return ObjectInfo(key=key, size=len(data), version=hashlib.sha256(data).hexdigest())

    def put_if_absent(self, key: str, data: bytes) -> PutResult:
        with _MEMORY_LOCK:
            if not self.exists(key):
                self.fs.pipe_file(self._path(key), bytes(data))
                info = ObjectInfo(key=key, size=len(data), version=hashlib.sha256(data).hexdigest())
                return PutResult(info=info, created=True)
        return self._resolve_existing(key, data)

    def put_if_match(self, key: str, data: bytes, version: str) -> ObjectInfo:
        with _MEMORY_LOCK:
            return super().put_if_match(key, data, version)
