"""Local-disk store: atomic create via ``link``, compare-and-swap under ``flock``."""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from ..errors import InvalidIdentifierError, ObjectNotFoundError, StoreError
from ._base import ObjectInfo, ObjectStore, PutResult, StoreCapabilities
from ._errors import mapped_errors

__all__ = ["LocalStore"]

_TEMP_MARK = ".rc-tmp-"
_LOCK_MARK = ".rc-lock-"


def _version(st: os.stat_result) -> str:
    # Every write goes through a fresh inode (temp file + rename/link) stamped with a unique
    # mtime (see _unique_mtime_ns), so inode + mtime + size changes on every replacement.
    return f"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"


_MTIME_LOCK = threading.Lock()
_last_mtime_ns = 0


def _unique_mtime_ns() -> int:
    """A strictly increasing nanosecond timestamp for this process.

    The kernel stamps files from a coarse clock (a jiffy, 1-10 ms, on many kernels) and ext4
    hands a freed inode straight to the next file, so two same-size writes within one tick
    would get the same inode + mtime + size, and a compare-and-swap holding the older token
    would wrongly succeed (ABA). Stamping the mtime ourselves makes each token unique.
    """
    global _last_mtime_ns
    with _MTIME_LOCK:
        _last_mtime_ns = max(time.time_ns(), _last_mtime_ns + 1)
        return _last_mtime_ns


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalStore(ObjectStore):
    """Objects are files under ``root``.

    Every write goes to a temporary name first (``.rc-tmp-*``, fsynced), then ``link`` (create-only:
    the kernel refuses an existing name) or ``rename`` (replace) moves it into place, so readers
    never see a partial object. Compare-and-swap holds an ``flock`` on a sidecar lock file
    (``.rc-lock-*``), which excludes other threads and processes on this host; it is not a
    distributed lock, so don't share one directory over NFS between hosts for publication.
    """

    capabilities = StoreCapabilities(atomic_put_if_absent=True, atomic_put_if_match=True)

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.root = Path(root).expanduser().resolve()
        self.url = self.root.as_uri()
        self.fsync = fsync

    # -- paths ----------------------------------------------------------------------------
    def _path(self, key: str) -> Path:
        self._check_key(key)
        for part in key.split("/"):
            if part.startswith((_TEMP_MARK, _LOCK_MARK)):
                # These names are the store's own temp and lock files: never listed, and a lock
                # file is deleted with its object, so a user object there would be lost.
                raise InvalidIdentifierError(
                    f"object key {key!r}: names starting with {_TEMP_MARK!r} or {_LOCK_MARK!r} "
                    "are reserved by the local store",
                    value=key,
                )
        return self.root / key

    def _conflict(self, key: str, exc: OSError) -> StoreError:
        """A key that is a folder here, or lies under an object (``a`` and ``a/b`` cannot coexist)."""
        return StoreError(
            f"{self.url}/{key}: on local disk a key cannot be both an object and a folder "
            f"({type(exc).__name__}: {exc.strerror or exc})",
            key=key,
            problem="object_folder_conflict",
        )

    def _mkdir_parent(self, key: str, path: Path) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError) as exc:
            raise self._conflict(key, exc) from None

    def _write_temp(self, path: Path, data: bytes) -> Path:
        tmp = path.parent / f"{_TEMP_MARK}{path.name}.{uuid.uuid4().hex}"
        try:
            with open(tmp, "xb") as fh:
                fh.write(data)
                fh.flush()
                stamp = _unique_mtime_ns()
                os.utime(fh.fileno(), ns=(stamp, stamp))
                if self.fsync:
                    fh.flush()
                    os.fsync(fh.fileno())
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise
        return tmp

    # -- plain ------------------------------------------------------------------------------
    @mapped_errors
    def put(self, key: str, data: bytes) -> ObjectInfo:
        path = self._path(key)
        self._mkdir_parent(key, path)
        tmp = self._write_temp(path, data)
        try:
            os.replace(tmp, path)
        except (IsADirectoryError, NotADirectoryError) as exc:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise self._conflict(key, exc) from None
        if self.fsync:
            _fsync_dir(path.parent)
        return self.stat(key)

    @mapped_errors
    @contextlib.contextmanager
    def open_write(self, key: str) -> Iterator[BinaryIO]:
        """Stream into a temp file (``.rc-tmp-*``); on a clean exit fsync it and ``rename`` it into
        place (readers never see a partial object); on an exception delete it."""
        path = self._path(key)
        self._mkdir_parent(key, path)
        tmp = path.parent / f"{_TEMP_MARK}{path.name}.{uuid.uuid4().hex}"
        try:
            with open(tmp, "xb") as fh:
                yield fh
                fh.flush()
                stamp = _unique_mtime_ns()
                os.utime(fh.fileno(), ns=(stamp, stamp))
                if self.fsync:
                    os.fsync(fh.fileno())
            try:
                os.replace(tmp, path)
            except (IsADirectoryError, NotADirectoryError) as exc:
                raise self._conflict(key, exc) from None
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise
        if self.fsync:
            _fsync_dir(path.parent)

    @mapped_errors
    def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return path.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFoundError(f"{self.url}/{key} does not exist", key=key) from None

    @mapped_errors
    def get_range(self, key: str, start: int, end: int) -> bytes:
        if start < 0 or end < start:
            raise StoreError(f"invalid byte range [{start}, {end})", key=key)
        try:
            with open(self._path(key), "rb") as fh:
                fh.seek(start)
                return fh.read(end - start)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFoundError(f"{self.url}/{key} does not exist", key=key) from None

    @mapped_errors
    def open_read(self, key: str) -> BinaryIO:
        try:
            return open(self._path(key), "rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFoundError(f"{self.url}/{key} does not exist", key=key) from None

    @mapped_errors
    def stat(self, key: str) -> ObjectInfo:
        path = self._path(key)
        try:
            st = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFoundError(f"{self.url}/{key} does not exist", key=key) from None
        if not path.is_file():
            raise ObjectNotFoundError(f"{self.url}/{key} is not an object", key=key)
        return ObjectInfo(key=key, size=st.st_size, version=_version(st))

    @mapped_errors
    def list(self, prefix: str = "") -> list[ObjectInfo]:
        self._check_prefix(prefix)
        base = self.root / prefix.rsplit("/", 1)[0] if "/" in prefix else self.root
        out: list[ObjectInfo] = []
        for path in self._walk(base):
            key = path.relative_to(self.root).as_posix()
            if not key.startswith(prefix):
                continue
            try:
                st = path.stat()
            except FileNotFoundError:
                continue  # deleted while listing
            out.append(ObjectInfo(key=key, size=st.st_size, version=_version(st)))
        out.sort(key=lambda info: info.key)
        return out

    @staticmethod
    def _walk(base: Path) -> Iterator[Path]:
        if not base.is_dir():
            return
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                if name.startswith(_TEMP_MARK) or name.startswith(_LOCK_MARK):
                    continue
                yield Path(dirpath) / name

    @mapped_errors
    def delete(self, key: str) -> None:
        path = self._path(key)
        if path.is_dir():
            return  # a folder is not an object: nothing to delete
        # NotADirectoryError: a parent is an object, so this key cannot exist either
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            path.unlink()
        lock = path.parent / f"{_LOCK_MARK}{path.name}"
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            lock.unlink()

    @mapped_errors
    def remove_empty_folders(self, prefix: str) -> None:
        """Remove the empty directories under ``prefix`` bottom-up, ``prefix`` included (its
        parents are shared with other writers and stay). Lock files of deleted objects do not
        count as content."""
        self._check_prefix(prefix)
        base = self.root / prefix.strip("/") if prefix.strip("/") else self.root
        if not base.is_dir():
            return
        for dirpath, _dirs, files in os.walk(base, topdown=False):
            folder = Path(dirpath)
            for name in files:
                if name.startswith(_LOCK_MARK) and not (folder / name[len(_LOCK_MARK) :]).exists():
                    with contextlib.suppress(FileNotFoundError):
                        (folder / name).unlink()
            with contextlib.suppress(OSError):  # not empty (a writer is here): leave it
                folder.rmdir()

    # -- conditional ---------------------------------------------------------------------------
    @mapped_errors
    def put_if_absent(self, key: str, data: bytes) -> PutResult:
        path = self._path(key)
        self._mkdir_parent(key, path)
        tmp = self._write_temp(path, data)
        try:
            os.link(tmp, path)
        except FileExistsError as exc:
            if path.is_dir():
                raise self._conflict(key, exc) from None
            return self._resolve_existing(key, data)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        if self.fsync:
            _fsync_dir(path.parent)
        return PutResult(info=self.stat(key), created=True)

    @mapped_errors
    def put_if_match(self, key: str, data: bytes, version: str) -> ObjectInfo:
        path = self._path(key)
        if not path.parent.is_dir():
            # no folder, so no object either; don't create folders for a swap that must fail
            raise ObjectNotFoundError(f"{self.url}/{key} does not exist", key=key)
        lock_path = path.parent / f"{_LOCK_MARK}{path.name}"
        with open(lock_path, "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                current = self.stat(key)  # ObjectNotFoundError when missing
                if current.version != version:
                    return self._resolve_changed(key, data, version, current.version)
                tmp = self._write_temp(path, data)
                os.replace(tmp, path)
                if self.fsync:
                    _fsync_dir(path.parent)
                return self.stat(key)
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
