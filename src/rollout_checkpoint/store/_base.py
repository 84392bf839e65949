"""The object-store interface every backend implements.

Objects are immutable blobs addressed by a relative ``/``-separated key under the store's
root URL. Besides plain put/get, a store offers the two conditional puts a commit protocol
needs: :meth:`ObjectStore.put_if_absent` (create-only) and :meth:`ObjectStore.put_if_match`
(compare-and-swap on an opaque version token). :class:`StoreCapabilities` says which of them
are *truly atomic* on this backend; publication refuses a backend where they are not
(see :meth:`ObjectStore.require_atomic_commits`).
"""

from __future__ import annotations

import abc
import contextlib
import io
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import BinaryIO, cast

from ..errors import (
    ConditionalWriteUnsupportedError,
    ObjectExistsError,
    ObjectNotFoundError,
    VersionChangedError,
)
from ..ids import validate_key

__all__ = ["ObjectInfo", "ObjectStore", "PutResult", "StoreCapabilities"]


@dataclass(frozen=True)
class StoreCapabilities:
    """What a backend can do, and which conditional puts it performs atomically.

    ``atomic_put_if_absent`` / ``atomic_put_if_match`` are ``True`` only where the backend
    itself decides the race (O_EXCL / ``link``, a lock held by the store, or an S3 precondition
    shown to be enforced). A ``False`` flag means the operation is emulated with a check and a
    write, which is racy: two writers can both "win".
    """

    atomic_put_if_absent: bool
    atomic_put_if_match: bool
    supports_ranged_get: bool = True
    supports_listing: bool = True
    supports_delete: bool = True


@dataclass(frozen=True)
class ObjectInfo:
    """Size and opaque version token of a stored object (version feeds ``put_if_match``)."""

    key: str
    size: int
    version: str | None = None


@dataclass(frozen=True)
class PutResult:
    """What a conditional put did: ``created`` is ``False`` when identical bytes were already there."""

    info: ObjectInfo
    created: bool


class ObjectStore(abc.ABC):
    """A small store interface over fsspec; see the module docstring for the contract."""

    url: str
    capabilities: StoreCapabilities

    # -- plain operations ---------------------------------------------------------------
    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> ObjectInfo:
        """Write (or overwrite) a whole object. Use only for keys no one else writes."""

    @abc.abstractmethod
    def get(self, key: str) -> bytes:
        """Read a whole object; ``ObjectNotFoundError`` if missing."""

    @abc.abstractmethod
    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Read bytes ``[start, end)``; fewer bytes only past the end of the object."""

    @abc.abstractmethod
    def open_read(self, key: str) -> BinaryIO:
        """A streaming, seekable reader (for digests and Parquet footers without whole loads)."""

    def open_write(self, key: str) -> AbstractContextManager[BinaryIO]:
        """Stream a new **non-conditional** object: ``with store.open_write(key) as fh: fh.write(b)``.

        The object appears under ``key`` only when the ``with`` block exits without an exception
        (do not close ``fh`` yourself); an exception discards what was written. Like :meth:`put`,
        use it only for keys no one else writes (unique names): it may overwrite, and on object
        stores it may become a multipart upload, which is why conditional objects (manifests,
        pointers) are never written this way but with one ``put_if_absent`` / ``put_if_match``.

        Backends stream the bytes (local disk: temp file, fsync, rename; fsspec/S3: the
        filesystem's buffered writer, multipart on S3); wrappers (``DelegatingStore``) forward
        it. This default, for a backend with no streaming writer, buffers the bytes in memory
        and makes one :meth:`put` on a clean exit.

        On fsspec object stores a failure *while finishing* the upload (or a backend that cannot
        discard) may still leave a partial object under ``key``; only a manifest that records the
        object's length and digest makes it part of a checkpoint, so such leftovers are garbage.
        """
        self._check_key(key)
        return _buffered_write(self, key)

    @abc.abstractmethod
    def stat(self, key: str) -> ObjectInfo:
        """Size and version of an object; ``ObjectNotFoundError`` if missing."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object whose key starts with ``prefix`` (a string prefix, not only a folder),
        sorted by key, always fresh (no listing cache hides other writers' objects)."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Delete an object; deleting a missing object is not an error."""

    # -- conditional operations --------------------------------------------------------------
    @abc.abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> PutResult:
        """Create ``key`` only if it does not exist.

        If the key exists with byte-identical content the put is treated as an idempotent
        success (``created=False``): that is how a retried put whose first try succeeded but
        whose answer was lost resolves. Different content raises ``ObjectExistsError``.
        Put a unique commit token in ``data`` where two writers must not both succeed.
        """

    @abc.abstractmethod
    def put_if_match(self, key: str, data: bytes, version: str) -> ObjectInfo:
        """Replace ``key`` only if its current version token equals ``version``.

        Raises ``VersionChangedError`` when the version differs and ``ObjectNotFoundError``
        when the key is missing. Conditional objects are always written with one request.
        Like ``put_if_absent``, a refused swap whose object already holds exactly ``data`` is an
        idempotent success: HTTP clients resend a request whose answer was lost (below any retry
        layer of ours), and the resend is refused because the first one landed. Put a unique
        commit token in ``data`` where two writers must not both succeed.
        """

    # -- helpers shared by all backends ------------------------------------------------------
    def exists(self, key: str) -> bool:
        try:
            self.stat(key)
        except ObjectNotFoundError:
            return False
        return True

    def remove_empty_folders(self, prefix: str) -> None:
        """Remove folders under ``prefix`` (and ``prefix`` itself) that hold no object any more.

        Object stores have no folders, so this default does nothing; local disk removes the
        empty directories deleting objects left behind. Call it only for a prefix no one writes
        to any more (a deleted checkpoint's), never for a shared one.
        """
        self._check_prefix(prefix)

    def iter_keys(self, prefix: str = "") -> Iterator[str]:
        for info in self.list(prefix):
            yield info.key

    def require_atomic_commits(self, *, accept_risk: bool = False) -> None:
        """Fail closed unless both conditional puts are atomic here.

        ``accept_risk=True`` lets a caller publish to a backend whose conditional puts are
        emulated (check, then write): two concurrent publishers may then both succeed.
        """
        caps = self.capabilities
        if accept_risk or (caps.atomic_put_if_absent and caps.atomic_put_if_match):
            return
        raise ConditionalWriteUnsupportedError(
            f"{self.url}: this backend cannot do atomic create-only and compare-and-swap puts, "
            "so a checkpoint published here could be overwritten by a racing writer; "
            "pass accept_risk=True (CLI: --accept-unsafe-store) to publish anyway",
            url=self.url,
            atomic_put_if_absent=caps.atomic_put_if_absent,
            atomic_put_if_match=caps.atomic_put_if_match,
        )

    @staticmethod
    def _check_key(key: str) -> str:
        return validate_key(key)

    @staticmethod
    def _check_prefix(prefix: str) -> str:
        # One trailing "/" is a folder prefix; "a//" or "/a" would never match a valid key.
        if prefix:
            validate_key(prefix[:-1] if prefix.endswith("/") else prefix)
        return prefix

    def _resolve_existing(self, key: str, data: bytes) -> PutResult:
        """After a create-only put lost: identical bytes = idempotent success, else conflict."""
        try:
            current = self.get(key)
        except ObjectNotFoundError:
            raise ObjectExistsError(
                f"{self.url}/{key}: create-only put failed but the object is gone again",
                key=key,
            ) from None
        if current == data:
            return PutResult(info=self.stat(key), created=False)
        raise ObjectExistsError(f"{self.url}/{key} already exists with different content", key=key)

    def _resolve_changed(self, key: str, data: bytes, expected: str, found: str | None) -> ObjectInfo:
        """After a compare-and-swap lost: the object already holding ``data`` = success, else conflict."""
        try:
            if self.get(key) == data:
                return self.stat(key)
        except ObjectNotFoundError:
            found = None
        raise VersionChangedError(
            f"{self.url}/{key} changed: expected version {expected}, found {found or 'no object'}",
            key=key,
            expected=expected,
            found=found,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


@contextlib.contextmanager
def _buffered_write(store: ObjectStore, key: str) -> Iterator[BinaryIO]:
    """``open_write`` for stores that only know whole-object puts: buffer, then one ``put``."""
    buffer = io.BytesIO()
    yield cast(BinaryIO, buffer)
    store.put(key, buffer.getvalue())
