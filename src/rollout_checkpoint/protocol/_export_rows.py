"""Export rows kept current between checkpoints, so a freeze costs what changed, not what lives.

An incremental export (the built-in agent, policy-model and resources participants) keeps, per
key, the row its last export built, and rebuilds only the keys that changed since. Walking every
live key inside the pause to collect those rows, sort them and test each against the commit's
scope was the whole remaining cost of a freeze at 100,000 live rollouts (and every list of
100,000 young objects it allocated made the garbage collector's young passes slow as well).

:class:`ExportRows` holds the rows in a dict the participant updates key by key (under its lock).
:meth:`ExportRows.freeze` copies that dict (one C-level copy; the rows are immutable values) and
returns a :class:`FrozenRows`, which sorts, filters by scope and lists the executions **on first
use**: after the resume for an asynchronous commit (in its upload), at once for a synchronous one.
The sorted key order is kept between exports while the set of keys does not change.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import Generic, TypeVar, cast

from ..ids import ExecutionId, LazyExecutions
from ._hooks import in_scope_items, scope_frozenset

__all__ = [
    "DeferredExecutions",
    "ExportRows",
    "FrozenRows",
    "ScopeSource",
    "deferred_scope",
    "resolve_scope",
]

K = TypeVar("K")
V = TypeVar("V")


class DeferredExecutions(LazyExecutions):
    """A sorted, distinct list of executions an export computes **after** the freeze (from the
    immutable snapshot it took): built once, on first use, thread-safe. An asynchronous commit
    leaves it unbuilt in its ``frozen`` reply and lists it in the committed one."""

    def __init__(self, build: Callable[[], Sequence[ExecutionId]]) -> None:
        self._build: Callable[[], Sequence[ExecutionId]] | None = build
        self._lock = threading.Lock()
        self._items: tuple[ExecutionId, ...] | None = None

    def resolve(self) -> tuple[ExecutionId, ...]:
        with self._lock:
            if self._items is None:
                assert self._build is not None
                self._items, self._build = tuple(self._build()), None
            return self._items

    _built = resolve

    @property
    def built(self) -> bool:
        return self._items is not None

    def __repr__(self) -> str:
        if self._items is None:
            return "DeferredExecutions(not built)"
        return f"DeferredExecutions({len(self._items)})"


class ExportRows(Generic[K, V]):
    """Per key (an execution, or an execution and a sub-key) the row the last export built.

    The owner keeps it current under its own lock: :meth:`set` after rebuilding a changed key's
    row, :meth:`discard` when the key no longer exports. ``execution_of`` maps a key to its
    execution (``None``: the keys are executions), ``sort_key`` orders keys (executions first,
    then the sub-key)."""

    def __init__(
        self, sort_key: Callable[[K], object], execution_of: Callable[[K], ExecutionId] | None = None
    ) -> None:
        self._rows: dict[K, V] = {}
        self._version = 0  # changes whenever a key is added or removed
        self._sorted: tuple[int, list[K]] | None = None  # keys in order, for a version
        self._execution_of = execution_of
        self._sort_key = sort_key

    def set(self, key: K, row: V) -> None:
        rows = self._rows
        size = len(rows)
        rows[key] = row  # one hash of the key (an execution id hashes in Python)
        if len(rows) != size:
            self._version += 1

    def discard(self, key: K) -> None:
        if self._rows.pop(key, _MISSING) is not _MISSING:
            self._version += 1

    def clear(self) -> None:
        if self._rows:
            self._version += 1
        self._rows = {}

    def freeze(self, scope: ScopeSource) -> FrozenRows[K, V]:
        """An immutable snapshot of the rows in ``scope`` (filtered and sorted on first use;
        ``scope`` may be a function giving the set, called then: see :func:`deferred_scope`)."""
        return FrozenRows(self, self._rows.copy(), self._version, scope)

    def _order(self, rows: dict[K, V], version: int) -> list[K]:
        cached = self._sorted
        if cached is not None and cached[0] == version:
            return cached[1]
        keys = sorted(rows, key=self._sort_key)  # type: ignore[arg-type]
        self._sorted = (version, keys)  # one assignment: a reader sees the old or the new pair
        return keys


_MISSING = object()


def _itself(execution: ExecutionId) -> ExecutionId:  # keys that are executions
    return execution


ScopeSource = frozenset[ExecutionId] | None | Callable[[], frozenset[ExecutionId] | None]
"""A commit's scope as an export takes it: the set, ``None`` (all), or a function giving it."""


def deferred_scope(scope: Sequence[ExecutionId] | None) -> Callable[[], frozenset[ExecutionId] | None]:
    """The set of an (immutable) scope, built when first asked for: after the freeze for an
    asynchronous commit (see :meth:`CommitRestore._export_for`)."""
    return partial(scope_frozenset, scope)


def resolve_scope(scope: ScopeSource) -> frozenset[ExecutionId] | None:
    """The set a :data:`ScopeSource` stands for."""
    return scope() if callable(scope) else scope


class FrozenRows(Generic[K, V]):
    """One export's rows: what :meth:`ExportRows.freeze` copied, listed on first use."""

    def __init__(self, owner: ExportRows[K, V], rows: dict[K, V], version: int, scope: ScopeSource) -> None:
        self._owner = owner
        self._rows = rows
        self._version = version
        self._scope = scope
        self._lock = threading.Lock()
        self._kept: tuple[list[K], list[V]] | None = None

    def kept(self) -> tuple[list[K], list[V]]:
        """The keys in scope, in order, and their rows (computed once)."""
        with self._lock:
            if self._kept is None:
                keys = self._owner._order(self._rows, self._version)
                keys = self._in_scope(keys)
                rows = self._rows
                self._kept = (keys, [rows[k] for k in keys])
            return self._kept

    def _in_scope(self, keys: list[K]) -> list[K]:
        scope = resolve_scope(self._scope)
        if scope is None:
            return keys  # every key: the sorted order itself, not a copy
        of = self._owner._execution_of
        if of is None:  # the keys are executions
            of = cast(Callable[[K], ExecutionId], _itself)
        return in_scope_items(scope, keys, of)

    def executions(self) -> DeferredExecutions:
        """The distinct executions of the kept keys, in order (built on first use)."""

        def build() -> list[ExecutionId]:
            keys = self.kept()[0]
            of = self._owner._execution_of
            if of is None:  # one key per execution
                return cast(list[ExecutionId], keys)
            out: list[ExecutionId] = []
            last: ExecutionId | None = None
            for k in keys:
                e = of(k)
                if last is None or e.rollout_id != last.rollout_id or e.attempt != last.attempt:
                    out.append(e)
                    last = e
            return out

        return DeferredExecutions(build)
