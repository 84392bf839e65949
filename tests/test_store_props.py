"""Property tests: key validation, and every store operation against a dict model."""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path

import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from rollout_checkpoint.errors import (
    InvalidIdentifierError,
    ObjectExistsError,
    ObjectNotFoundError,
    VersionChangedError,
)
from rollout_checkpoint.ids import validate_key
from rollout_checkpoint.store import LocalStore, MemoryStore, ObjectStore

SEGMENT = st.text(
    alphabet=st.sampled_from("ab.-_/\\\x00\x1f\x7f é"),
    min_size=0,
    max_size=12,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=SEGMENT)
def test_keys_are_valid_or_refused_before_io(key: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        stores: list[ObjectStore] = [LocalStore(Path(tmp) / "s"), MemoryStore(f"p-{uuid.uuid4().hex}")]
        try:
            validate_key(key)
        except InvalidIdentifierError:
            for store in stores:
                for call in (
                    lambda s=store: s.put(key, b"x"),
                    lambda s=store: s.put_if_absent(key, b"x"),
                    lambda s=store: s.get(key),
                ):
                    try:
                        call()
                    except InvalidIdentifierError:
                        pass
                    else:
                        raise AssertionError(f"{key!r} accepted by {store}")
                assert store.list() == []
            assert all(not p.is_file() for p in Path(tmp).rglob("*"))
            return
        segments = key.split("/")
        assert "" not in segments and "." not in segments and ".." not in segments
        for store in stores:
            store.put(key, b"payload")
            assert store.get(key) == b"payload"
            assert [i.key for i in store.list()] == [key]


KEYS = ["m/a", "m/b", "m/c/d", "n", "n-2/x"]
DATA = st.binary(max_size=64)


class StoreModel(RuleBasedStateMachine):
    """Drive a real store and a dict side by side; they must always agree."""

    store: ObjectStore

    def __init__(self) -> None:
        super().__init__()
        self.model: dict[str, bytes] = {}
        self.stale: dict[str, str] = {}

    def make_store(self) -> ObjectStore:
        raise NotImplementedError

    @initialize()
    def setup(self) -> None:
        self.store = self.make_store()

    @rule(key=st.sampled_from(KEYS), data=DATA)
    def put(self, key: str, data: bytes) -> None:
        if key in self.model:
            self.stale[key] = self.store.stat(key).version or ""
        info = self.store.put(key, data)
        assert info.size == len(data)
        self.model[key] = data

    @rule(key=st.sampled_from(KEYS), data=DATA)
    def put_if_absent(self, key: str, data: bytes) -> None:
        try:
            result = self.store.put_if_absent(key, data)
        except ObjectExistsError:
            assert key in self.model and self.model[key] != data
            return
        if key in self.model:
            assert self.model[key] == data and not result.created
        else:
            assert result.created
            self.model[key] = data

    @rule(key=st.sampled_from(KEYS), data=DATA)
    def put_if_match_current(self, key: str, data: bytes) -> None:
        if key not in self.model:
            try:
                self.store.put_if_match(key, data, "whatever")
            except ObjectNotFoundError:
                return
            raise AssertionError("put_if_match on a missing key succeeded")
        old = self.store.stat(key)
        assert old.version is not None
        new = self.store.put_if_match(key, data, old.version)
        assert new.version == self.store.stat(key).version
        if data != self.model[key]:
            self.stale[key] = old.version
        self.model[key] = data

    @precondition(lambda self: bool(self.stale))
    @rule(data=DATA, pick=st.integers(min_value=0))
    def put_if_match_stale(self, data: bytes, pick: int) -> None:
        key = sorted(self.stale)[pick % len(self.stale)]
        version = self.stale[key]
        if key in self.model and self.store.stat(key).version == version:
            return  # the old bytes came back (e.g. memory's content-hash versions)
        try:
            self.store.put_if_match(key, data, version)
        except VersionChangedError:
            assert key not in self.model or self.model[key] != data
        except ObjectNotFoundError:
            assert key not in self.model
        else:
            assert self.model.get(key) == data  # only an idempotent resend may pass

    @rule(key=st.sampled_from(KEYS))
    def delete(self, key: str) -> None:
        self.store.delete(key)
        self.model.pop(key, None)

    @rule(key=st.sampled_from(KEYS), start=st.integers(0, 70), length=st.integers(0, 70))
    def get_range(self, key: str, start: int, length: int) -> None:
        if key not in self.model:
            try:
                self.store.get_range(key, start, start + length)
            except ObjectNotFoundError:
                return
            raise AssertionError("get_range on a missing key succeeded")
        assert self.store.get_range(key, start, start + length) == self.model[key][start : start + length]

    @rule(prefix=st.sampled_from(["", "m", "m/", "m/c", "n", "n-", "zzz"]))
    def list_prefix(self, prefix: str) -> None:
        listed = self.store.list(prefix)
        assert [i.key for i in listed] == sorted(k for k in self.model if k.startswith(prefix))
        assert [i.size for i in listed] == [len(self.model[i.key]) for i in listed]

    @invariant()
    def contents_agree(self) -> None:
        if not hasattr(self, "store"):
            return
        for key in KEYS:
            if key in self.model:
                assert self.store.get(key) == self.model[key]
            else:
                assert not self.store.exists(key)


class LocalStoreModel(StoreModel):
    def make_store(self) -> ObjectStore:
        self._tmp = tempfile.TemporaryDirectory()
        return LocalStore(self._tmp.name, fsync=False)

    def teardown(self) -> None:
        if hasattr(self, "_tmp"):
            self._tmp.cleanup()


class MemoryStoreModel(StoreModel):
    def make_store(self) -> ObjectStore:
        return MemoryStore(f"model-{uuid.uuid4().hex}")


MODEL_SETTINGS = settings(max_examples=40, stateful_step_count=25, deadline=None)
TestLocalStoreModel = LocalStoreModel.TestCase
TestLocalStoreModel.settings = MODEL_SETTINGS
TestMemoryStoreModel = MemoryStoreModel.TestCase
TestMemoryStoreModel.settings = MODEL_SETTINGS
