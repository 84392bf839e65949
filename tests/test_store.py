"""The ObjectStore contract on every backend (local disk, memory, S3 on a moto server), races,
key validation, the counting wrapper and the generic (non-atomic) fsspec backend."""

from __future__ import annotations

import hashlib
import io
import multiprocessing
import os
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import fsspec
import pytest

from rollout_checkpoint.errors import (
    ConditionalWriteUnsupportedError,
    InvalidIdentifierError,
    ObjectExistsError,
    ObjectNotFoundError,
    StoreError,
    VersionChangedError,
)
from rollout_checkpoint.store import (
    CountingStore,
    FsspecStore,
    LocalStore,
    MemoryStore,
    ObjectStore,
    PutResult,
    open_store,
)

RACERS = 24


# -- round trip ------------------------------------------------------------------------------


def test_round_trip_every_operation(any_store: ObjectStore) -> None:
    data = bytes(range(256)) * 40
    info = any_store.put("a/b/obj.bin", data)
    assert info.key == "a/b/obj.bin"
    assert info.size == len(data)
    assert info.version

    assert any_store.get("a/b/obj.bin") == data
    assert any_store.get_range("a/b/obj.bin", 10, 20) == data[10:20]
    assert any_store.get_range("a/b/obj.bin", len(data) - 5, len(data) + 100) == data[-5:]
    assert any_store.get_range("a/b/obj.bin", len(data), len(data) + 10) == b""
    assert any_store.get_range("a/b/obj.bin", len(data) + 50, len(data) + 60) == b""
    assert any_store.get_range("a/b/obj.bin", 7, 7) == b""

    with any_store.open_read("a/b/obj.bin") as fh:
        assert fh.read(4) == data[:4]
        fh.seek(-8, io.SEEK_END)
        assert fh.read() == data[-8:]
        fh.seek(100)
        assert fh.tell() == 100
        assert fh.read(3) == data[100:103]

    stat = any_store.stat("a/b/obj.bin")
    assert (stat.size, stat.version) == (len(data), info.version)
    assert any_store.exists("a/b/obj.bin")
    assert not any_store.exists("a/b")  # a "directory" is not an object

    any_store.put("a/bc", b"1")
    any_store.put("a/b/c/deep", b"22")
    any_store.put("z", b"")
    keys = [i.key for i in any_store.list()]
    assert keys == ["a/b/c/deep", "a/b/obj.bin", "a/bc", "z"]
    assert [i.key for i in any_store.list("a/b")] == ["a/b/c/deep", "a/b/obj.bin", "a/bc"]
    assert [i.key for i in any_store.list("a/b/")] == ["a/b/c/deep", "a/b/obj.bin"]
    assert [i.key for i in any_store.list("a/b/o")] == ["a/b/obj.bin"]
    assert any_store.list("nothing-here/") == []
    assert list(any_store.iter_keys("a/b/c")) == ["a/b/c/deep"]
    sizes = {i.key: i.size for i in any_store.list()}
    assert sizes == {"a/b/c/deep": 2, "a/b/obj.bin": len(data), "a/bc": 1, "z": 0}
    assert any_store.get("z") == b""

    new = any_store.put("a/b/obj.bin", b"replaced")
    assert new.version != info.version
    assert any_store.get("a/b/obj.bin") == b"replaced"

    any_store.delete("a/b/obj.bin")
    assert not any_store.exists("a/b/obj.bin")
    any_store.delete("a/b/obj.bin")  # deleting a missing object is fine
    assert [i.key for i in any_store.list()] == ["a/b/c/deep", "a/bc", "z"]


def test_listed_version_feeds_put_if_match(any_store: ObjectStore) -> None:
    any_store.put("ptr", b"v1")
    (listed,) = any_store.list("ptr")
    assert listed.version == any_store.stat("ptr").version
    assert listed.version is not None
    any_store.put_if_match("ptr", b"v2", listed.version)
    assert any_store.get("ptr") == b"v2"


def test_missing_objects_raise_not_found(any_store: ObjectStore) -> None:
    calls: list[Callable[[], Any]] = [
        lambda: any_store.get("nope/x"),
        lambda: any_store.get_range("nope/x", 0, 10),
        lambda: any_store.get_range("nope/x", 0, 0),
        lambda: any_store.open_read("nope/x"),
        lambda: any_store.stat("nope/x"),
        lambda: any_store.put_if_match("nope/x", b"d", "some-version"),
    ]
    for call in calls:
        with pytest.raises(ObjectNotFoundError) as info:
            call()
        assert info.value.code == "not_found"
        assert isinstance(info.value, FileNotFoundError)
    assert not any_store.exists("nope/x")
    any_store.delete("nope/x")
    assert any_store.list("nope") == []


def test_invalid_byte_range(any_store: ObjectStore) -> None:
    any_store.put("r", b"0123456789")
    with pytest.raises(StoreError):
        any_store.get_range("r", -1, 3)
    with pytest.raises(StoreError):
        any_store.get_range("r", 5, 3)


# -- conditional puts ---------------------------------------------------------------------------


def test_put_if_absent_create_identical_and_conflict(any_store: ObjectStore) -> None:
    first = any_store.put_if_absent("m/manifest.json", b'{"token": "abc"}')
    assert first.created is True
    assert first.info.size == 16
    assert first.info.version == any_store.stat("m/manifest.json").version

    again = any_store.put_if_absent("m/manifest.json", b'{"token": "abc"}')
    assert again == PutResult(info=first.info, created=False)

    with pytest.raises(ObjectExistsError) as info:
        any_store.put_if_absent("m/manifest.json", b'{"token": "other"}')
    assert info.value.code == "already_exists"
    assert any_store.get("m/manifest.json") == b'{"token": "abc"}'


def test_put_if_absent_empty_object(any_store: ObjectStore) -> None:
    assert any_store.put_if_absent("empty", b"").created
    assert any_store.get("empty") == b""
    assert not any_store.put_if_absent("empty", b"").created
    with pytest.raises(ObjectExistsError):
        any_store.put_if_absent("empty", b"x")
    any_store.put("full", b"content")
    with pytest.raises(ObjectExistsError):
        any_store.put_if_absent("full", b"")
    assert any_store.get("full") == b"content"


def test_put_if_match_swaps_only_the_expected_version(any_store: ObjectStore) -> None:
    v1 = any_store.put("latest", b"ckpt-1").version
    assert v1 is not None
    v2 = any_store.put_if_match("latest", b"ckpt-2", v1)
    assert v2.version and v2.version != v1
    assert v2.version == any_store.stat("latest").version
    assert any_store.get("latest") == b"ckpt-2"

    with pytest.raises(VersionChangedError) as info:
        any_store.put_if_match("latest", b"ckpt-3", v1)
    assert info.value.code == "version_changed"
    assert any_store.get("latest") == b"ckpt-2"

    assert v2.version is not None
    v3 = any_store.put_if_match("latest", b"ckpt-3", v2.version)
    assert any_store.get("latest") == b"ckpt-3"

    # A resend of a swap that already landed (stale version, our exact bytes) is a success.
    again = any_store.put_if_match("latest", b"ckpt-3", v2.version)
    assert again.version == v3.version == any_store.stat("latest").version


def _race(n: int, fn: Callable[[int], Any]) -> list[Any]:
    """Run ``fn(i)`` in ``n`` threads released together; results or exceptions, by index."""
    barrier = threading.Barrier(n)

    def run(i: int) -> Any:
        barrier.wait()
        try:
            return fn(i)
        except Exception as exc:
            return exc

    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(run, range(n)))


def test_put_if_absent_race_has_exactly_one_winner(any_store: ObjectStore) -> None:
    for trial in range(3):
        key = f"race/{trial}/manifest.json"
        results = _race(RACERS, lambda i, key=key: any_store.put_if_absent(key, f"writer-{i}".encode()))
        winners = [i for i, r in enumerate(results) if isinstance(r, PutResult) and r.created]
        losers = [r for r in results if isinstance(r, ObjectExistsError)]
        assert len(winners) == 1, results
        assert len(losers) == RACERS - 1, results
        assert any_store.get(key) == f"writer-{winners[0]}".encode()


def test_put_if_absent_race_with_identical_bytes_creates_once(any_store: ObjectStore) -> None:
    results = _race(RACERS, lambda i: any_store.put_if_absent("same", b"identical commit"))
    assert all(isinstance(r, PutResult) for r in results), results
    assert sum(r.created for r in results) == 1
    assert len({r.info.version for r in results}) == 1


def test_put_if_match_race_has_exactly_one_winner(any_store: ObjectStore) -> None:
    for trial in range(3):
        key = f"cas/{trial}/latest"
        version = any_store.put(key, b"base").version
        assert version is not None
        results = _race(RACERS, lambda i, k=key, v=version: any_store.put_if_match(k, f"w-{i}".encode(), v))
        winners = [i for i, r in enumerate(results) if not isinstance(r, Exception)]
        assert len(winners) == 1, results
        assert all(isinstance(r, VersionChangedError) for i, r in enumerate(results) if i != winners[0])
        assert any_store.get(key) == f"w-{winners[0]}".encode()


def _process_racer(root: str, mode: str, index: int, version: str, start: Any, out: Any) -> None:
    store = LocalStore(root)
    start.wait()
    try:
        if mode == "absent":
            out.put((index, store.put_if_absent("race/obj", f"proc-{index}".encode()).created))
        else:
            store.put_if_match("race/obj", f"proc-{index}".encode(), version)
            out.put((index, True))
    except (ObjectExistsError, VersionChangedError):
        out.put((index, False))
    except Exception as exc:  # surfaced to the parent as a failure
        out.put((index, repr(exc)))


@pytest.mark.parametrize("mode", ["absent", "match"])
def test_local_multiprocess_race_has_exactly_one_winner(tmp_path: Path, mode: str) -> None:
    root = str(tmp_path / "store")
    store = LocalStore(root)
    version = store.put("race/obj", b"base").version if mode == "match" else ""
    assert version is not None
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_process_racer, args=(root, mode, i, version, start, out)) for i in range(8)]
    for proc in procs:
        proc.start()
    start.set()
    results = dict(out.get(timeout=60) for _ in procs)
    for proc in procs:
        proc.join(timeout=30)
    assert all(isinstance(v, bool) for v in results.values()), results
    winners = [i for i, won in results.items() if won]
    assert len(winners) == 1, results
    assert store.get("race/obj") == f"proc-{winners[0]}".encode()
    assert [i.key for i in store.list()] == ["race/obj"]  # no temp or lock files listed


# -- key validation -------------------------------------------------------------------------------

BAD_KEYS = [
    "",
    "/abs",
    "a/../b",
    "..",
    "../x",
    "a//b",
    "a/./b",
    "trail/",
    "nul\x00",
    "tab\tkey",
    "a\\b",
    "\x7f",
]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_invalid_keys_refused_before_io(any_store: ObjectStore, key: str) -> None:
    before = [i.key for i in any_store.list()]
    calls: list[Callable[[], Any]] = [
        lambda: any_store.put(key, b"x"),
        lambda: any_store.get(key),
        lambda: any_store.get_range(key, 0, 1),
        lambda: any_store.open_read(key),
        lambda: any_store.stat(key),
        lambda: any_store.exists(key),
        lambda: any_store.delete(key),
        lambda: any_store.put_if_absent(key, b"x"),
        lambda: any_store.put_if_match(key, b"x", "v"),
    ]
    for call in calls:
        with pytest.raises(InvalidIdentifierError):
            call()
    assert [i.key for i in any_store.list()] == before


@pytest.mark.parametrize("prefix", ["/abs", "../", "a/../", "a//"])
def test_invalid_list_prefix_refused(any_store: ObjectStore, prefix: str) -> None:
    with pytest.raises(InvalidIdentifierError):
        any_store.list(prefix)


def test_local_store_cannot_escape_its_root(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "inner")
    with pytest.raises(InvalidIdentifierError):
        store.put("../outside", b"x")
    assert not (tmp_path / "outside").exists()


# -- capabilities -----------------------------------------------------------------------------------


def test_local_and_memory_are_atomic(local_store: LocalStore, memory_store: MemoryStore) -> None:
    for store in (local_store, memory_store):
        assert store.capabilities.atomic_put_if_absent
        assert store.capabilities.atomic_put_if_match
        store.require_atomic_commits()


def test_open_store_dispatch(tmp_path: Path) -> None:
    assert isinstance(open_store(str(tmp_path / "p")), LocalStore)
    assert isinstance(open_store(f"file://{tmp_path}/f"), LocalStore)
    assert isinstance(open_store(f"memory://m-{uuid.uuid4().hex}"), MemoryStore)
    generic = open_store(f"dir::file://{tmp_path}")
    assert type(generic) is FsspecStore
    store = LocalStore(tmp_path / "x")
    assert open_store(store) is store
    with pytest.raises(StoreError):
        open_store("")
    with pytest.raises(StoreError):
        open_store("no-such-protocol-xyz://a/b")


# -- generic fsspec backend (not special-cased) -----------------------------------------------------


@pytest.fixture(params=["file-fs", "dir-url"])
def generic_store(request: pytest.FixtureRequest, tmp_path: Path) -> FsspecStore:
    if request.param == "file-fs":
        root = tmp_path / "generic"
        root.mkdir()
        return FsspecStore(fsspec.filesystem("file"), str(root), root.as_uri())
    store = open_store(f"dir::file://{tmp_path}")
    assert isinstance(store, FsspecStore)
    return store


def test_generic_fsspec_store_round_trip(generic_store: FsspecStore, tmp_path: Path) -> None:
    generic_store.put("a/b/c", b"hello")
    generic_store.put("a/d", b"world!")
    assert generic_store.get("a/b/c") == b"hello"
    assert generic_store.get_range("a/d", 1, 3) == b"or"
    with generic_store.open_read("a/d") as fh:
        assert fh.read() == b"world!"
    assert [i.key for i in generic_store.list("a/")] == ["a/b/c", "a/d"]
    assert generic_store.put_if_absent("a/d", b"world!").created is False
    with pytest.raises(ObjectExistsError):
        generic_store.put_if_absent("a/d", b"other")
    version = generic_store.stat("a/d").version
    assert version is not None
    generic_store.put_if_match("a/d", b"next", version)
    with pytest.raises(VersionChangedError):
        generic_store.put_if_match("a/d", b"again", version)
    generic_store.delete("a/d")
    with pytest.raises(ObjectNotFoundError):
        generic_store.get("a/d")
    # objects live directly under the root (no nested copy of the root path)
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert files in (["generic/a/b/c"], ["a/b/c"])


def test_generic_fsspec_store_refuses_publication(generic_store: FsspecStore) -> None:
    assert not generic_store.capabilities.atomic_put_if_absent
    assert not generic_store.capabilities.atomic_put_if_match
    with pytest.raises(ConditionalWriteUnsupportedError) as info:
        generic_store.require_atomic_commits()
    assert info.value.code == "conditional_writes_unsupported"
    assert "accept_risk" in info.value.message
    generic_store.require_atomic_commits(accept_risk=True)


# -- counting wrapper ------------------------------------------------------------------------------


def test_counting_store_counts_requests_bytes_and_keys(any_store: ObjectStore) -> None:
    counting = CountingStore(any_store)
    assert counting.url == any_store.url
    counting.put("idx/index.parquet", b"i" * 100)
    counting.put("payload/shard-0", b"p" * 5000)
    assert counting.put_if_absent("m.json", b"{}").created
    version = counting.stat("m.json").version
    assert version is not None
    counting.put_if_match("m.json", b'{"a":1}', version)
    assert counting.bytes_written == 100 + 5000 + 2 + 7
    assert counting.bytes_read == 0
    assert counting.keys_read == set()

    counting.reset()
    assert counting.get("idx/index.parquet") == b"i" * 100
    assert counting.get_range("m.json", 0, 3) == b'{"a'
    with counting.open_read("payload/shard-0") as fh:
        assert fh.read(10) == b"p" * 10
        fh.seek(4990)
        buf = bytearray(20)
        assert fh.readinto(buf) == 10
    counting.list("idx/")
    assert counting.exists("m.json")
    counting.delete("m.json")

    assert counting.bytes_read == 100 + 3 + 10 + 10
    assert counting.bytes_read_by_key == {"idx/index.parquet": 100, "m.json": 3, "payload/shard-0": 20}
    assert counting.keys_read == {"idx/index.parquet", "m.json", "payload/shard-0"}
    assert counting.keys_read_under(["payload/"]) == {"payload/shard-0"}
    assert counting.requests == {
        "get": 1,
        "get_range": 1,
        "open_read": 1,
        "list": 1,
        "exists": 1,
        "delete": 1,
    }
    assert counting.bytes_written == 0


def test_counting_reader_streams_to_hashlib_and_pyarrow(local_store: LocalStore) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"x": list(range(200_000))})
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=20_000, compression="none")
    data = sink.getvalue()
    local_store.put("shard.parquet", data)
    counting = CountingStore(local_store)

    digest = hashlib.sha256()
    with counting.open_read("shard.parquet") as fh:
        for block in iter(lambda: fh.read(4096), b""):
            digest.update(block)
    assert digest.hexdigest() == hashlib.sha256(data).hexdigest()
    assert counting.bytes_read == len(data)

    counting.reset()
    with counting.open_read("shard.parquet") as fh:
        meta = pq.ParquetFile(fh).metadata  # footer only
    assert meta.num_rows == 200_000
    assert len(data) > 1_000_000
    assert 0 < counting.bytes_read < len(data) / 10


def test_counting_store_is_thread_safe(memory_store: MemoryStore) -> None:
    counting = CountingStore(memory_store)
    counting.put("k", b"abc")
    _race(16, lambda i: [counting.get("k") for _ in range(20)])
    assert counting.requests["get"] == 16 * 20
    assert counting.bytes_read == 16 * 20 * 3


def test_counting_store_delegates_capabilities(tmp_path: Path) -> None:
    generic = FsspecStore(fsspec.filesystem("file"), str(tmp_path), tmp_path.as_uri())
    counting = CountingStore(generic)
    assert counting.capabilities == generic.capabilities
    with pytest.raises(ConditionalWriteUnsupportedError):
        counting.require_atomic_commits()
    counting.require_atomic_commits(accept_risk=True)
    CountingStore(LocalStore(tmp_path / "l")).require_atomic_commits()


def test_local_store_leaves_no_temp_files(local_store: LocalStore) -> None:
    local_store.put_if_absent("a/x", b"1")
    with pytest.raises(ObjectExistsError):
        local_store.put_if_absent("a/x", b"2")
    names = os.listdir(local_store.root / "a")
    assert [n for n in names if n.startswith(".rc-tmp-")] == []


def test_local_versions_stay_unique_with_a_coarse_clock(
    local_store: LocalStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A frozen clock models a kernel stamping files from a coarse tick while ext4 hands the
    # freed inode straight to the next file: versions must still never repeat (no ABA).
    from rollout_checkpoint.store import _local

    monkeypatch.setattr(_local.time, "time_ns", lambda: 1_700_000_000_000_000_000)
    versions = [local_store.put("ptr", b"A" if i % 2 else b"B").version for i in range(200)]
    assert len(set(versions)) == len(versions)
    stale = versions[-3]
    assert stale is not None
    with pytest.raises(VersionChangedError):
        local_store.put_if_match("ptr", b"C", stale)
    assert local_store.get("ptr") == b"A"  # the last of 200 writes


def test_local_store_reads_never_create_the_root(tmp_path: Path) -> None:
    """A mistyped path opened for reading must not leave a directory behind."""
    root = tmp_path / "does" / "not" / "exist"
    store = LocalStore(root)
    assert store.list() == []
    assert not store.exists("a.json")
    assert not root.exists()
    store.put("a.json", b"{}")
    assert root.is_dir() and store.get("a.json") == b"{}"


# -- bad input on local disk: typed errors, nothing lost ---------------------------------------------


def test_local_object_and_folder_conflicts_are_typed_and_lose_nothing(local_store: LocalStore) -> None:
    local_store.put("a", b"object a")
    local_store.put("d/x", b"object d/x")
    for call in (
        lambda: local_store.put("a/b", b"x"),
        lambda: local_store.put_if_absent("a/b", b"x"),
        lambda: local_store.put("d", b"x"),
        lambda: local_store.put_if_absent("d", b"x"),
    ):
        with pytest.raises(StoreError) as info:
            call()
        assert type(info.value) is StoreError and info.value.code == "store_error"
        assert "both an object and a folder" in info.value.message
    with pytest.raises(ObjectNotFoundError):
        local_store.put_if_match("a/b", b"x", "v")
    with pytest.raises(ObjectNotFoundError):
        local_store.put_if_match("d", b"x", "v")
    local_store.delete("d")  # a folder is not an object: nothing happens
    local_store.delete("a/b")  # cannot exist under an object: nothing happens
    assert {i.key: local_store.get(i.key) for i in local_store.list()} == {
        "a": b"object a",
        "d/x": b"object d/x",
    }
    assert not [p for p in local_store.root.rglob(".rc-tmp-*")]


@pytest.mark.parametrize("key", [".rc-lock-m", "k/.rc-lock-m", ".rc-tmp-x", "k/.rc-tmp-x.1/y"])
def test_local_reserved_names_refused(local_store: LocalStore, key: str) -> None:
    # A user object named like the store's lock file would be hidden from list() and deleted
    # together with its neighbour: refused before any I/O instead.
    for call in (
        lambda: local_store.put(key, b"precious"),
        lambda: local_store.put_if_absent(key, b"precious"),
        lambda: local_store.get(key),
        lambda: local_store.delete(key),
    ):
        with pytest.raises(InvalidIdentifierError):
            call()
    local_store.put("k/m", b"m")
    version = local_store.stat("k/m").version
    assert version is not None
    local_store.put_if_match("k/m", b"m2", version)  # creates the sidecar lock file
    local_store.delete("k/m")
    assert local_store.list() == []


def test_open_store_url_edge_cases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for url in ("s3://", "s3:///x", "file://", "local://"):
        with pytest.raises(StoreError):
            open_store(url)
    root = open_store("memory://")
    assert isinstance(root, MemoryStore) and root.url == "memory://"
    # options that only S3 understands are refused clearly, not with a TypeError
    with pytest.raises(StoreError, match="endpoint_url"):
        open_store(str(tmp_path / "l"), endpoint_url="http://127.0.0.1:9")
    with pytest.raises(StoreError, match="endpoint_url"):
        open_store("memory://x", endpoint_url="http://127.0.0.1:9")
    # retry= applies to remote requests only; the local backends accept and ignore it
    local = open_store(str(tmp_path / "l"), retry=None, fsync=False)
    assert isinstance(local, LocalStore) and local.fsync is False
    assert isinstance(open_store("memory://x", retry=None), MemoryStore)
    assert list(tmp_path.iterdir()) == []  # nothing was created by opening


# -- streaming writes (open_write) -----------------------------------------------------------------


def test_open_write_streams_an_object_visible_only_after_a_clean_exit(any_store: ObjectStore) -> None:
    chunks = [os.urandom(n) for n in (1, 70_000, 0, 1 << 20, 12)]
    with any_store.open_write("s/obj.parquet") as fh:
        for chunk in chunks:
            fh.write(chunk)
            assert not any_store.exists("s/obj.parquet")  # nothing visible while writing
    data = b"".join(chunks)
    assert any_store.get("s/obj.parquet") == data
    assert any_store.stat("s/obj.parquet").size == len(data)
    assert [i.key for i in any_store.list("s/")] == ["s/obj.parquet"]
    # a non-conditional write: a second stream replaces the object
    with any_store.open_write("s/obj.parquet") as fh:
        fh.write(b"second")
    assert any_store.get("s/obj.parquet") == b"second"
    with any_store.open_write("s/empty") as fh:
        pass
    assert any_store.get("s/empty") == b""


def test_open_write_exception_leaves_no_object(any_store: ObjectStore) -> None:
    with pytest.raises(RuntimeError), any_store.open_write("s/partial") as fh:
        fh.write(b"x" * 100_000)
        raise RuntimeError("writer crashed")
    assert not any_store.exists("s/partial")
    assert any_store.list("s/") == []
    if isinstance(any_store, LocalStore):
        assert os.listdir(any_store.root / "s") == []  # the temp file is gone too


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", "a//b"])
def test_open_write_refuses_invalid_keys_before_io(any_store: ObjectStore, key: str) -> None:
    with pytest.raises(InvalidIdentifierError):
        any_store.open_write(key).__enter__()


def test_open_write_default_buffers_into_one_put(memory_store: MemoryStore) -> None:
    # a delegating store that only knows put() gets open_write through the base class
    puts: list[tuple[str, bytes]] = []

    class PutOnly(CountingStore):
        def put(self, key: str, data: bytes) -> Any:
            puts.append((key, data))
            return super().put(key, data)

        open_write = ObjectStore.open_write  # type: ignore[assignment]

    store = PutOnly(memory_store)
    with store.open_write("k") as fh:
        fh.write(b"ab")
        fh.write(b"cd")
    assert puts == [("k", b"abcd")] and memory_store.get("k") == b"abcd"
    with pytest.raises(RuntimeError), store.open_write("k2") as fh:
        fh.write(b"zz")
        raise RuntimeError
    assert len(puts) == 1 and not memory_store.exists("k2")


def test_counting_store_counts_open_write(local_store: LocalStore) -> None:
    store = CountingStore(local_store)
    with store.open_write("w") as fh:
        fh.write(b"12345")
        fh.write(memoryview(b"678"))
    assert store.requests["open_write"] == 1 and store.bytes_written == 8
    assert local_store.get("w") == b"12345678"


def test_generic_fsspec_open_write(generic_store: FsspecStore) -> None:
    with generic_store.open_write("g/obj") as fh:
        fh.write(b"streamed")
    assert generic_store.get("g/obj") == b"streamed"
