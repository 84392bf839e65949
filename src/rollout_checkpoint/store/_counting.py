"""A delegating store that counts what passes through it.

Recovery promises to classify rollouts from manifests and member indexes only, never payloads;
wrapping the store in :class:`CountingStore` lets a test (or an operator) check that promise by
looking at :attr:`CountingStore.keys_read` and the byte counters.
"""

from __future__ import annotations

import contextlib
import io
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any, BinaryIO, cast

from ._base import ObjectInfo, ObjectStore, PutResult
from ._delegating import DelegatingStore

__all__ = ["CountingStore"]


class CountingStore(DelegatingStore):
    """Wraps ``inner`` and counts calls made *through the wrapper*.

    * ``requests``: calls per operation name (``"get"``, ``"put_if_absent"``, ...);
    * ``bytes_read`` / ``bytes_written``: payload bytes returned by reads (including bytes read
      from :meth:`open_read` file objects, as they are read) and bytes handed to writes;
    * ``keys_read``: keys read by ``get``, ``get_range`` or ``open_read``, with
      ``bytes_read_by_key`` per key.

    Requests the inner backend makes on its own (e.g. the re-read inside a create-only put that
    found an object) are not counted: this measures what the caller asked for.
    """

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self._lock = threading.Lock()
        self.requests: Counter[str] = Counter()
        self.bytes_read = 0
        self.bytes_written = 0
        self.bytes_read_by_key: Counter[str] = Counter()
        self.keys_read: set[str] = set()

    # -- bookkeeping ---------------------------------------------------------------------------
    def reset(self) -> None:
        """Zero every counter (e.g. between the write and the read phase of a test)."""
        with self._lock:
            self.requests.clear()
            self.bytes_read = 0
            self.bytes_written = 0
            self.bytes_read_by_key.clear()
            self.keys_read.clear()

    def _request(self, op: str, *, written: int = 0) -> None:
        with self._lock:
            self.requests[op] += 1
            self.bytes_written += written

    def _read(self, key: str, n: int) -> None:
        with self._lock:
            self.bytes_read += n
            self.bytes_read_by_key[key] += n
            self.keys_read.add(key)

    def keys_read_under(self, prefixes: Iterable[str]) -> set[str]:
        """The read keys that start with any of ``prefixes``."""
        wanted = tuple(prefixes)
        return {key for key in self.keys_read if key.startswith(wanted)}

    # -- delegation ------------------------------------------------------------------------------
    def put(self, key: str, data: bytes) -> ObjectInfo:
        self._request("put", written=len(data))
        return self.inner.put(key, data)

    @contextlib.contextmanager
    def open_write(self, key: str) -> Iterator[BinaryIO]:
        """Counted as one ``open_write`` request (on a clean exit) with the bytes written."""
        with self.inner.open_write(key) as raw:
            writer = _CountingWriter(raw)
            yield cast(BinaryIO, writer)
        self._request("open_write", written=writer.written)

    def get(self, key: str) -> bytes:
        self._request("get")
        data = self.inner.get(key)
        self._read(key, len(data))
        return data

    def get_range(self, key: str, start: int, end: int) -> bytes:
        self._request("get_range")
        data = self.inner.get_range(key, start, end)
        self._read(key, len(data))
        return data

    def open_read(self, key: str) -> BinaryIO:
        self._request("open_read")
        raw = self.inner.open_read(key)
        self._read(key, 0)
        return cast(BinaryIO, _CountingReader(raw, lambda n: self._read(key, n)))

    def stat(self, key: str) -> ObjectInfo:
        self._request("stat")
        return self.inner.stat(key)

    def exists(self, key: str) -> bool:
        self._request("exists")
        return self.inner.exists(key)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        self._request("list")
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self._request("delete")
        self.inner.delete(key)

    def put_if_absent(self, key: str, data: bytes) -> PutResult:
        self._request("put_if_absent", written=len(data))
        return self.inner.put_if_absent(key, data)

    def put_if_match(self, key: str, data: bytes, version: str) -> ObjectInfo:
        self._request("put_if_match", written=len(data))
        return self.inner.put_if_match(key, data, version)


class _CountingReader(io.RawIOBase):
    """A seekable reader that reports every byte it hands out (pyarrow and hashlib friendly)."""

    def __init__(self, raw: BinaryIO, count: Callable[[int], None]) -> None:
        super().__init__()
        self._raw = raw
        self._count = count

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        data = self._raw.read(-1 if size is None else size)
        self._count(len(data))
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self._raw.read(len(view))
        view[: len(data)] = data
        self._count(len(data))
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._raw.seek(offset, whence)

    def tell(self) -> int:
        return self._raw.tell()

    @property
    def size(self) -> int | None:
        """The object size where the inner reader knows it (s3fs, memory files)."""
        value = getattr(self._raw, "size", None)
        return int(value) if value is not None else None

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


class _CountingWriter(io.RawIOBase):
    """Passes writes through to the inner writer and counts their bytes."""

    def __init__(self, raw: BinaryIO) -> None:
        super().__init__()
        self._raw = raw
        self.written = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._raw.write(view)
        self.written += len(view)
        return len(view)

    def tell(self) -> int:
        return self.written

    def close(self) -> None:
        # the inner writer is finished by the open_write context, never by its users
        super().close()
