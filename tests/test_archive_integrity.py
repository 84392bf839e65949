"""Corruption of any referenced object is detected by verify(), by the reader, and named."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rollout_checkpoint.archive import ComponentManifest
from rollout_checkpoint.errors import IntegrityError
from rollout_checkpoint.format import ArchiveReader
from rollout_checkpoint.store import ObjectStore
from test_archive import PREFIX, ident, make_records, write_archive


def flip_byte(store: ObjectStore, key: str, at: int) -> None:
    data = bytearray(store.get(key))
    data[at % len(data)] ^= 0x01
    store.put(key, bytes(data))


def truncate(store: ObjectStore, key: str) -> None:
    data = store.get(key)
    store.put(key, data[: len(data) // 2])


def extend(store: ObjectStore, key: str) -> None:
    store.put(key, store.get(key) + b"\x00")


@pytest.fixture(params=["local", "memory", "s3"])
def store(request: pytest.FixtureRequest) -> ObjectStore:
    return request.getfixturevalue(f"{request.param}_store")  # type: ignore[no-any-return]


def _archive(store: ObjectStore) -> tuple[ComponentManifest, list]:  # type: ignore[type-arg]
    records = make_records(240, payload_bytes=300)
    _, manifest = write_archive(store, records, target_shard_bytes=12 << 10, row_group_rows=16)
    assert len(manifest.shards) >= 3
    return manifest, records


Damage = Callable[[ObjectStore, str], None]
CASES: dict[str, tuple[Damage, str]] = {
    "flip": (lambda s, k: flip_byte(s, k, 10), "altered"),  # inside the first row group
    "flip-mid": (lambda s, k: flip_byte(s, k, len(s.get(k)) // 3), "altered"),
    "flip-last": (lambda s, k: flip_byte(s, k, -1), "altered"),
    "truncate": (truncate, "truncated"),
    "extend": (extend, "extended"),
    "delete": (lambda s, k: s.delete(k), "missing"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_damaged_shard_detected(store: ObjectStore, case: str) -> None:
    manifest, records = _archive(store)
    damage, problem = CASES[case]
    target = f"{PREFIX}/{manifest.shards[1].key}"
    damage(store, target)
    reader = ArchiveReader.open(store, PREFIX)
    with pytest.raises(IntegrityError) as info:
        reader.verify()
    assert info.value.details["key"] == target and info.value.details["problem"] == problem
    assert target in str(info.value) and problem in str(info.value)
    problems = reader.check()
    assert [p.details["key"] for p in problems] == [target]
    # the reader never yields a record of the damaged shard
    seen = []
    with pytest.raises(IntegrityError, match=manifest.shards[1].key):
        for rec in reader.iter_records():
            seen.append(rec)
    assert seen == records[: manifest.shards[0].records]
    # lookups into intact shards still work; lookups into the damaged one fail loudly
    members = list(reader.members())
    in_intact = next(m for m in members if m.shard == 2)
    assert reader.get_raw(in_intact.kind, in_intact.rollout_id, in_intact.attempt, in_intact.key)
    # a lookup checks the one row group it downloads: damage there is caught, damage elsewhere
    # (another row group, the footer, appended bytes) does not affect it and verify() reports it
    in_shard = [m for m in members if m.shard == 1]
    in_damaged = {"flip": in_shard[0], "truncate": in_shard[-1], "delete": in_shard[0]}.get(case)
    if in_damaged is not None:
        with pytest.raises(IntegrityError, match=manifest.shards[1].key):
            reader.get(in_damaged.kind, in_damaged.rollout_id, in_damaged.attempt, in_damaged.key)


@pytest.mark.parametrize("case", sorted(CASES))
def test_damaged_index_detected(store: ObjectStore, case: str) -> None:
    manifest, records = _archive(store)
    damage, problem = CASES[case]
    target = f"{PREFIX}/{manifest.index.key}"
    damage(store, target)
    reader = ArchiveReader.open(store, PREFIX)
    with pytest.raises(IntegrityError) as info:
        reader.verify()
    assert info.value.details == {**info.value.details, "key": target, "problem": problem}
    with pytest.raises(IntegrityError, match="index"):
        list(reader.members())
    with pytest.raises(IntegrityError, match="index"):
        reader.get(*ident(records[0]))


def test_replaced_index_from_another_archive_detected(store: ObjectStore) -> None:
    manifest, _ = _archive(store)
    _, other = write_archive(store, make_records(10), prefix="elsewhere")
    store.put(f"{PREFIX}/{manifest.index.key}", store.get(f"elsewhere/{other.index.key}"))
    with pytest.raises(IntegrityError, match=manifest.index.key):
        ArchiveReader.open(store, PREFIX).verify()


def test_flipped_byte_in_every_region_of_a_shard_is_detected(memory_store: ObjectStore) -> None:
    manifest, _ = _archive(memory_store)
    key = f"{PREFIX}/{manifest.shards[0].key}"
    original = memory_store.get(key)
    for at in (0, 4, len(original) // 2, manifest.shards[0].footer_offset or 0, len(original) - 5):
        flip_byte(memory_store, key, at)
        with pytest.raises(IntegrityError, match="altered"):
            ArchiveReader.open(memory_store, PREFIX).verify()
        memory_store.put(key, original)
        ArchiveReader.open(memory_store, PREFIX).verify()


def test_altered_manifest_detected_by_expected_digest(memory_store: ObjectStore) -> None:
    _archive(memory_store)
    key = f"{PREFIX}/manifest.json"
    ref_sha = ArchiveReader.open(memory_store, PREFIX).manifest_ref.sha256
    memory_store.put(key, memory_store.get(key).replace(b'"extra":{', b'"extra":{"x":1,'))
    ArchiveReader.open(memory_store, PREFIX)  # still a valid manifest on its own...
    with pytest.raises(IntegrityError, match=r"manifest\.json"):
        ArchiveReader.open(memory_store, PREFIX, expected_sha256=ref_sha)  # ...but not the pinned one
