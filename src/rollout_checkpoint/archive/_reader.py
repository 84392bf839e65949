"""The archive reader: opens a committed component manifest and reads what it references.

Every byte it hands out is checked against a digest reached from the manifest: whole shards by
their SHA-256 before any record of them is decoded, the index before it is parsed, and on a
point lookup the one downloaded row group by the per-row-group digest the (checked) index holds.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterable, Iterator
from typing import Any, Self

import orjson
import pyarrow as pa

from ..errors import IntegrityError, InvalidRecordError, ObjectNotFoundError
from ..store import ObjectStore
from ._binary import BINARY_FIELDS, binary_payload_dict, is_binary_payload
from ._errors import MemberNotFoundError
from ._index import MemberIndex, MemberRef, compute, int64_array, scalar
from ._manifest import ComponentManifest, ManifestRef, ShardEntry, parse_component_manifest
from ._parquet_io import open_parquet_file
from ._referring import ReferringArchive
from ._rows import RawRecord, WindowFile, check_schema, raw_rows
from ._schema import MANIFEST_NAME, join_key

__all__ = ["RawArchiveReader", "RawRecord", "check_object", "component_prefixes", "find_component_prefixes"]

_CHUNK = 1 << 20


def _missing(key: str, what: str) -> IntegrityError:
    return IntegrityError(f"{key}: {what} is missing", key=key, problem="missing")


def check_bytes(key: str, data: bytes, expected_bytes: int, expected_sha256: str, what: str) -> None:
    """Raise ``IntegrityError`` naming ``key`` when ``data`` has the wrong length or digest."""
    if len(data) != expected_bytes:
        problem = "truncated" if len(data) < expected_bytes else "extended"
        raise IntegrityError(
            f"{key}: {what} is {problem}: {len(data)} bytes, the manifest records {expected_bytes}",
            key=key,
            problem=problem,
            expected_bytes=expected_bytes,
            found_bytes=len(data),
        )
    found = hashlib.sha256(data).hexdigest()
    if found != expected_sha256:
        raise IntegrityError(
            f"{key}: {what} is altered: sha256 {found}, the manifest records {expected_sha256}",
            key=key,
            problem="altered",
            expected_sha256=expected_sha256,
            found_sha256=found,
        )


def check_object(store: ObjectStore, key: str, expected_bytes: int, expected_sha256: str, what: str) -> None:
    """Stream ``key`` in 1 MiB chunks (never the whole object in memory) and check its length and
    SHA-256; ``IntegrityError`` naming the key says missing, truncated, extended or altered."""
    digest = hashlib.sha256()
    size = 0
    try:
        with store.open_read(key) as fh:
            while True:
                chunk = fh.read(_CHUNK)
                if not chunk:
                    break
                size += len(chunk)
                if size > expected_bytes:
                    break
                digest.update(chunk)
    except (ObjectNotFoundError, FileNotFoundError):
        raise _missing(key, what) from None
    if size != expected_bytes:
        problem = "truncated" if size < expected_bytes else "extended"
        raise IntegrityError(
            f"{key}: {what} is {problem}: "
            f"{size if size < expected_bytes else 'more than ' + str(expected_bytes)} bytes, "
            f"the manifest records {expected_bytes}",
            key=key,
            problem=problem,
            expected_bytes=expected_bytes,
        )
    found = digest.hexdigest()
    if found != expected_sha256:
        raise IntegrityError(
            f"{key}: {what} is altered: sha256 {found}, the manifest records {expected_sha256}",
            key=key,
            problem="altered",
            expected_sha256=expected_sha256,
            found_sha256=found,
        )


def component_prefixes(keys: Iterable[str]) -> list[str]:
    """Archive prefixes among object ``keys``: the folders that hold a ``manifest.json``."""
    out = []
    for key in keys:
        if key == MANIFEST_NAME:
            out.append("")
        elif key.endswith("/" + MANIFEST_NAME):
            out.append(key[: -len(MANIFEST_NAME) - 1])
    return out


def find_component_prefixes(store: ObjectStore, prefix: str = "") -> list[str]:
    """Prefixes under ``prefix`` that hold a ``manifest.json`` (one committed archive each)."""
    return component_prefixes(info.key for info in store.list(prefix))


_PARSED: dict[str, ComponentManifest] = {}
"""Parsed manifests by the SHA-256 of their bytes (immutable, so safe to share): a format-2
archive opens the same base manifests at every checkpoint, and parsing one (its ``extra`` lists
every execution) costs far more than fetching and hashing it."""
_PARSED_KEPT = 512
_parsed_lock = threading.Lock()


def _remember(sha256: str, manifest: ComponentManifest) -> None:
    with _parsed_lock:
        if len(_PARSED) >= _PARSED_KEPT:
            _PARSED.pop(next(iter(_PARSED)))
        _PARSED[sha256] = manifest


class RawArchiveReader(ReferringArchive):
    """A committed component archive. Open with :meth:`open`; see the module docstring."""

    def __init__(
        self, store: ObjectStore, prefix: str, manifest: ComponentManifest, manifest_ref: ManifestRef
    ):
        self.store = store
        self.prefix = prefix
        self.manifest = manifest
        self.manifest_ref = manifest_ref
        self._index: MemberIndex | None = None
        self._resolver_cache = None

    @classmethod
    def open(cls, store: ObjectStore, prefix: str, *, expected_sha256: str | None = None) -> Self:
        """Read and validate ``prefix/manifest.json`` only (no shard, no index).

        ``ObjectNotFoundError`` when there is no manifest (the archive was never committed),
        ``IntegrityError`` when its bytes differ from ``expected_sha256`` or do not parse,
        ``UnsupportedSchemaError`` for a newer manifest schema.
        """
        prefix = prefix.strip("/")
        key = join_key(prefix, MANIFEST_NAME)
        data = store.get(key)
        ref = ManifestRef.of(key, data)
        if expected_sha256 is not None and ref.sha256 != expected_sha256:
            raise IntegrityError(
                f"{key}: manifest is altered: sha256 {ref.sha256}, expected {expected_sha256}",
                key=key,
                problem="altered",
                expected_sha256=expected_sha256,
                found_sha256=ref.sha256,
            )
        manifest = _PARSED.get(ref.sha256)
        if manifest is None:
            try:
                manifest = parse_component_manifest(data)
            except InvalidRecordError as exc:
                raise IntegrityError(f"{key}: {exc.message}", key=key, problem="invalid") from None
            _remember(ref.sha256, manifest)
        return cls(store, prefix, manifest, ref)

    def key_of(self, relative: str) -> str:
        """Store key of an object named relative to this archive (as manifests name them)."""
        return join_key(self.prefix, relative)

    # -- integrity ----------------------------------------------------------------------------
    def check(self) -> list[IntegrityError]:
        """Every problem found (streams each shard and the index once; in format 2 also the
        reference table and what it refers to, see ``ReferenceResolver.check``); empty when intact."""
        problems = self.check_stored()
        if self.manifest.references is not None and not problems:
            try:
                problems.extend(self._resolver().check())
            except IntegrityError as exc:
                problems.append(exc)
        return problems

    def check_stored(self) -> list[IntegrityError]:
        """The problems of the objects this archive stores itself (shards and member index)."""
        problems: list[IntegrityError] = []
        for i, shard in enumerate(self.manifest.shards):
            try:
                check_object(self.store, self.key_of(shard.key), shard.bytes, shard.sha256, f"shard {i}")
            except IntegrityError as exc:
                problems.append(exc)
        try:
            self._member_index()
        except IntegrityError as exc:
            problems.append(exc)
        return problems

    def _open_pinned(self, store: ObjectStore, prefix: str, sha256: str) -> RawArchiveReader:
        """A base archive, its manifest checked against the SHA-256 that pins it."""
        return RawArchiveReader.open(store, prefix, expected_sha256=sha256)

    def _checked_object(self, relative: str, size: int, sha256: str, what: str) -> bytes:
        """One whole object of this archive, its length and SHA-256 checked."""
        key = self.key_of(relative)
        try:
            data = self.store.get(key)
        except ObjectNotFoundError:
            raise _missing(key, what) from None
        check_bytes(key, data, size, sha256, what)
        return data

    def verify(self) -> None:
        """Raise the first ``IntegrityError`` :meth:`check` finds (missing / truncated / altered)."""
        problems = self.check()
        if problems:
            raise problems[0]

    def _member_index(self) -> MemberIndex:
        """The digest-checked, parsed member index (read once, then cached)."""
        if self._index is None:
            entry = self.manifest.index
            key = self.key_of(entry.key)
            try:
                data = self.store.get(key)
            except ObjectNotFoundError:
                raise _missing(key, "member index") from None
            check_bytes(key, data, entry.bytes, entry.sha256, "member index")
            try:
                index = MemberIndex.from_bytes(data, len(self.manifest.shards))
            except InvalidRecordError as exc:
                raise IntegrityError(f"{key}: {exc.message}", key=key, problem="invalid") from None
            if index.rows != entry.rows or index.counts() != {
                k: n for k, n in self.manifest.record_counts.items() if n
            }:
                raise IntegrityError(
                    f"{key}: member index does not match the manifest's record counts",
                    key=key,
                    problem="inconsistent",
                )
            self._index = index
        return self._index

    # -- members ------------------------------------------------------------------------------
    def members(self, kind: str | None = None) -> Iterator[MemberRef]:
        """Members from the index only (no shard is read), in write order; then, in version 2, the
        referenced members from the reference table (``base`` set, location in that base)."""
        yield from self._member_index().members(kind)
        for r in self.references(kind):
            yield MemberRef(
                kind=r.kind,
                rollout_id=r.rollout_id,
                attempt=r.attempt,
                key=r.key,
                revision=r.revision,
                refs=json.loads(r.refs) if r.refs is not None else None,
                shard=r.shard,
                row_group=r.row_group,
                row=r.row,
                base=r.base,
            )

    def stored_members(self) -> Iterator[MemberRef]:
        """The members this archive stores itself (its member index only; no reference table)."""
        yield from self._member_index().members()

    def stored_locations(self) -> Iterator[tuple[tuple[str, str, int, str], int, int, int]]:
        """``((kind, rollout_id, attempt, key), shard, row_group, row)`` of every member this
        archive stores itself (as :meth:`stored_members`, without building a member object or
        parsing its refs: what a catalog of the archive needs, for tens of thousands of members)."""
        yield from self._member_index().locations()

    def _shard_data(self, i: int, shard: ShardEntry) -> bytes:
        key = self.key_of(shard.key)
        try:
            data = self.store.get(key)
        except ObjectNotFoundError:
            raise _missing(key, f"shard {i}") from None
        check_bytes(key, data, shard.bytes, shard.sha256, f"shard {i}")
        return data

    def _row_groups(
        self, kind: str | None, columns: list[str] | None = None
    ) -> Iterator[tuple[pa.Table, str]]:
        """Row groups of the shards that hold ``kind`` (all when None), in write order, each
        shard's digest checked before any of its rows is decoded; filtered to ``kind``."""
        wanted = None if kind is None else self._member_index().shards_with(kind)
        if columns is not None and kind is not None and "kind" not in columns:
            columns = ["kind", *columns]
        for i, shard in enumerate(self.manifest.shards):
            if wanted is not None and i not in wanted:
                continue
            data = self._shard_data(i, shard)
            pf = open_parquet_file(pa.BufferReader(data))
            key = self.key_of(shard.key)
            check_schema(pf.schema_arrow, key)
            for rg in range(pf.num_row_groups):
                # use_threads=False everywhere we decode: our row groups are small, and Arrow's
                # lazily started CPU pool can abort the process at interpreter exit (apache/arrow#34314)
                table = pf.read_row_group(rg, columns=columns, use_threads=False)
                if kind is not None:
                    table = compute("filter", table, compute("equal", table["kind"], scalar(kind)))
                yield table, key

    def iter_raw(self, kind: str | None = None) -> Iterator[RawRecord]:
        """Members with undecoded payloads, shard by shard in write order.

        Each shard (at most ``target_shard_bytes``) is downloaded and its digest checked before
        any of its rows is yielded, so a corrupt shard never yields a record.
        """
        for table, key in self._row_groups(kind):
            yield from raw_rows(table, key)
        refs = self.references(kind)
        if refs:
            yield from self._resolver().read(refs)

    def iter_dicts(self, kind: str | None = None) -> Iterator[dict[str, Any]]:
        """Every payload parsed into a dict (orjson), without building record models: the fast
        way to read a whole archive. Same checks and order as :meth:`iter_raw`. A binary
        payload (docs/format.md, "Binary payloads") gives the dict of its JSON form (its raw
        field as URL-safe base64, as JSON payloads carry ``bytes``)."""
        loads = orjson.loads
        maybe_binary = kind is None or kind in BINARY_FIELDS
        for table, key in self._row_groups(kind, ["kind", "payload"]):
            payloads = table.column("payload").to_pylist()
            if maybe_binary and any(map(is_binary_payload, payloads)):
                # binary payloads (docs/format.md, "Binary payloads"): one at a time
                kinds = table.column("kind").to_pylist()
                yield from (_payload_dict(k, p, key) for k, p in zip(kinds, payloads, strict=True))
                continue
            try:  # the fast path: one map, each dict handed on as it is parsed
                yield from map(loads, payloads)
            except orjson.JSONDecodeError as exc:
                raise IntegrityError(
                    f"{key}: a payload is not JSON: {exc}", key=key, problem="invalid"
                ) from None
        refs = self.references(kind)
        if refs:
            for raw in self._resolver().read(refs):
                yield _payload_dict(raw.kind, raw.payload, self.prefix)

    def get_raw(self, kind: str, rollout_id: str, attempt: int, key: str) -> RawRecord:
        """One member: the cached index plus exactly one ranged GET of its row group."""
        index = self._member_index()
        pos = index.position(kind, rollout_id, attempt, key)
        if pos is None and self.manifest.references is not None:
            wanted = (kind, rollout_id, attempt, key)
            for r in self.references(kind):
                if r.identity == wanted:
                    (found,) = self._resolver().read([r])
                    assert isinstance(found, RawRecord)
                    return found
        if pos is None:
            raise MemberNotFoundError(
                f"no member {kind}/{rollout_id}#{attempt}/{key} in archive {self.prefix!r}",
                kind=kind,
                rollout_id=rollout_id,
                attempt=attempt,
                key=key,
            )
        shard_no, row_group, row = index.locate(pos)
        shard_key = self.key_of(self.manifest.shards[shard_no].key)
        rows = self.read_rows(shard_no, row_group, [row])
        if len(rows) != 1 or (rows[0].kind, rows[0].rollout_id, rows[0].attempt, rows[0].key) != (
            kind,
            rollout_id,
            attempt,
            key,
        ):
            raise IntegrityError(
                f"{shard_key}: the member index points to another row "
                f"for {kind}/{rollout_id}#{attempt}/{key}",
                key=shard_key,
                problem="inconsistent",
            )
        return rows[0]

    def read_rows(self, shard_no: int, row_group: int, rows: list[int]) -> list[RawRecord]:
        """Rows ``rows`` of one row group stored here: one ranged GET, its SHA-256 checked against
        the (digest-checked) index before anything is decoded."""
        index = self._member_index()
        if not 0 <= shard_no < len(self.manifest.shards) or not 0 <= row_group < len(index.spans[shard_no]):
            key = self.key_of(self.manifest.index.key)
            raise IntegrityError(
                f"{key}: no row group {shard_no}/{row_group} in this archive", key=key, problem="inconsistent"
            )
        shard = self.manifest.shards[shard_no]
        span = index.spans[shard_no][row_group]
        shard_key = self.key_of(shard.key)
        try:
            data = self.store.get_range(shard_key, span.offset, span.offset + span.length)
        except ObjectNotFoundError:
            raise _missing(shard_key, f"shard {shard_no}") from None
        check_bytes(shard_key, data, span.length, span.sha256, f"row group {row_group} of shard {shard_no}")
        pf = open_parquet_file(
            WindowFile(shard.bytes, span.offset, data), metadata=index.footer_metadata(shard_no)
        )
        try:
            table = pf.read_row_group(row_group, use_threads=False)
        except (pa.ArrowException, OSError) as exc:
            raise IntegrityError(
                f"{shard_key}: row group {row_group} cannot be decoded: {exc}",
                key=shard_key,
                problem="invalid",
            ) from None
        if any(not 0 <= r < table.num_rows for r in rows):
            raise IntegrityError(
                f"{shard_key}: row group {row_group} has no row {rows}", key=shard_key, problem="inconsistent"
            )
        table = compute("take", table, int64_array(rows)) if rows != list(range(table.num_rows)) else table
        return list(raw_rows(table, shard_key))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.store!r}, {self.prefix!r})"


def _payload_dict(kind: str, payload: bytes, key: str) -> dict[str, Any]:
    """One payload as :meth:`ArchiveReader.iter_dicts` gives it: JSON parsed, a binary payload
    as the dict of its JSON form; anything else is damage (``IntegrityError``)."""
    try:
        if is_binary_payload(payload):
            return binary_payload_dict(kind, payload)
        parsed: dict[str, Any] = orjson.loads(payload)
        return parsed
    except (orjson.JSONDecodeError, ValueError) as exc:
        raise IntegrityError(
            f"{key}: a {kind} payload is neither JSON nor a valid binary payload: {exc}",
            key=key,
            problem="invalid",
        ) from None
