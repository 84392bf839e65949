"""Archive format version 2: member references into earlier archives (the archive layer alone)."""

from __future__ import annotations

import json
import uuid

import pytest

from rollout_checkpoint.archive import ArchiveWriter, RawArchiveReader, parse_component_manifest
from rollout_checkpoint.archive._references import Reference
from rollout_checkpoint.errors import IntegrityError
from rollout_checkpoint.store import MemoryStore

KIND = "blob"


def _store() -> MemoryStore:
    return MemoryStore(f"refs-{uuid.uuid4().hex}")


def _write(store: MemoryStore, cid: str, members: dict[str, bytes], instance: str = "i") -> ArchiveWriter:
    writer = ArchiveWriter(
        store,
        f"checkpoints/{cid}/components/k/{instance}",
        checkpoint_id=cid,
        participant_kind="k",
        instance=instance,
    )
    for rollout_id, payload in members.items():
        writer.write_raw(KIND, rollout_id, 0, "x", payload, revision=len(payload), refs={"n": len(payload)})
    return writer


def _commit(writer: ArchiveWriter) -> RawArchiveReader:
    writer.commit(extra={})
    return RawArchiveReader.open(writer.store, writer.prefix)


def _refer(writer: ArchiveWriter, base: RawArchiveReader, skip: frozenset[str] = frozenset()) -> None:
    rows = [
        Reference(
            m.kind,
            m.rollout_id,
            m.attempt,
            m.key,
            m.revision,
            json.dumps(m.refs),
            0,
            m.shard,
            m.row_group,
            m.row,
        )
        for m in base.members()
        if m.rollout_id not in skip
    ]
    writer.refer([(base.prefix, base.manifest_ref)], _columns(rows))


def _columns(rows: list[Reference]) -> list[list[object]]:
    """The reference table's columns of ``rows``."""
    return [[getattr(r, name) for r in rows] for name in Reference._fields]


def _two_archives(store: MemoryStore) -> tuple[RawArchiveReader, RawArchiveReader]:
    w1 = _write(store, "c1", {f"r{i}": b"x" * (i + 1) for i in range(5)})
    base = _commit(w1)
    w2 = _write(store, "c2", {"r0": b"changed"})
    _refer(w2, base, skip=frozenset({"r0"}))
    return base, _commit(w2)


def test_a_version_2_archive_lists_stored_and_referenced_members() -> None:
    store = _store()
    base, archive = _two_archives(store)
    manifest = archive.manifest
    assert manifest.schema_version == 2 and manifest.references is not None
    assert manifest.references.rows == 4 and [b.prefix for b in manifest.bases or []] == [base.prefix]
    members = {m.rollout_id: m for m in archive.members()}
    assert members["r0"].base is None and all(members[f"r{i}"].base == 0 for i in range(1, 5))
    assert {r.rollout_id: r.payload for r in archive.iter_raw()} == {
        "r0": b"changed",
        **{f"r{i}": b"x" * (i + 1) for i in range(1, 5)},
    }
    assert archive.get_raw(KIND, "r3", 0, "x").payload == b"xxxx"
    assert archive.check() == []
    # version 1 stays byte-compatible: an archive without references has no new keys
    assert set(json.loads(store.get(f"{base.prefix}/manifest.json"))) >= {"schema_version"}
    assert "bases" not in json.loads(store.get(f"{base.prefix}/manifest.json"))
    assert parse_component_manifest(store.get(f"{base.prefix}/manifest.json")).schema_version == 1


@pytest.mark.parametrize("how", ["delete", "alter"])
def test_a_damaged_base_shard_fails_check_and_reads(how: str) -> None:
    store = _store()
    base, archive = _two_archives(store)
    key = f"{base.prefix}/{base.manifest.shards[0].key}"
    if how == "delete":
        store.delete(key)
    else:
        data = bytearray(store.get(key))
        data[8] ^= 0xFF  # inside the first row group
        store.put(key, bytes(data))
    problems = archive.check()
    assert problems and key in problems[0].message
    fresh = RawArchiveReader.open(store, archive.prefix)
    with pytest.raises(IntegrityError):
        list(fresh.iter_raw())


def test_an_altered_base_manifest_or_reference_table_is_refused() -> None:
    store = _store()
    base, archive = _two_archives(store)
    manifest_key = f"{base.prefix}/manifest.json"
    store.put(manifest_key, store.get(manifest_key).replace(b'"instance":"i"', b'"instance":"j"'))
    with pytest.raises(IntegrityError, match="altered"):
        RawArchiveReader.open(store, archive.prefix).open_bases()
    store2 = _store()
    _, archive2 = _two_archives(store2)
    assert archive2.manifest.references is not None
    table = f"{archive2.prefix}/{archive2.manifest.references.key}"
    store2.put(table, store2.get(table) + b"\0")
    with pytest.raises(IntegrityError, match="reference table"):
        list(RawArchiveReader.open(store2, archive2.prefix).members())


def test_a_reference_to_a_row_that_holds_another_member_is_refused() -> None:
    store = _store()
    w1 = _write(store, "c1", {"a": b"1", "b": b"22"})
    base = _commit(w1)
    a = next(m for m in base.members() if m.rollout_id == "a")
    w2 = _write(store, "c2", {})
    # claims "b" lives where "a" is stored
    w2.refer(
        [(base.prefix, base.manifest_ref)],
        _columns([Reference(KIND, "b", 0, "x", 2, '{"n":2}', 0, a.shard, a.row_group, a.row)]),
    )
    archive = _commit(w2)
    with pytest.raises(IntegrityError, match="not the referenced member"):
        list(archive.iter_raw())
    assert archive.check()


def test_a_base_of_another_component_is_refused() -> None:
    store = _store()
    w1 = _write(store, "c1", {"a": b"1"}, instance="other")
    base = _commit(w1)
    w2 = _write(store, "c2", {})
    _refer(w2, base)
    archive = _commit(w2)
    with pytest.raises(IntegrityError, match="neither an earlier archive nor a part"):
        archive.open_bases()


def test_an_identity_both_stored_and_referenced_is_refused() -> None:
    store = _store()
    w1 = _write(store, "c1", {"a": b"1"})
    base = _commit(w1)
    w2 = _write(store, "c2", {"a": b"2"})
    _refer(w2, base)
    archive = _commit(w2)
    with pytest.raises(IntegrityError, match="listed twice"):
        list(archive.members())
