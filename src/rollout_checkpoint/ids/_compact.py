"""Execution ids in compact form, checked in one pass: the internal hops of a worker group.

A scope of 1,000 executions as ``{"rollout_id", "attempt"}`` objects costs a pydantic model and a
Python-level id check per execution at every hop. In compact form a scope is a list of
``"<rollout_id>#<attempt>"`` strings (``str(ExecutionId)``); :func:`unpack_executions` checks the
whole list with one regular expression over the joined strings, under exactly the rules of
:func:`~rollout_checkpoint.ids.validate_id` (pattern, at most 128 characters, no ``..``), and
:func:`checked_pairs` does the same for the ``[[rollout_id, attempt], ...]`` lists a component
manifest's ``extra`` holds. Anything else is a typed error naming the first bad entry.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Iterable, Iterator, Sequence, Sized
from typing import Any, overload

from ..errors import InvalidIdentifierError, InvalidValueError
from ._keys import ID_MAX_LENGTH, validate_id
from ._models import ExecutionId
from ._scope_memo import ScopeMemo

__all__ = [
    "LazyExecutions",
    "PackedExecutions",
    "check_packed",
    "check_packed_text",
    "checked_pairs",
    "execution_ids",
    "pack_executions",
    "pack_text",
    "unpack_executions",
]

_ID = rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{ID_MAX_LENGTH - 1}}}"
_ATTEMPT = r"(?:0|[1-9][0-9]{0,17})"
_PACKED = re.compile(rf"(?:{_ID}#{_ATTEMPT}\n)*")
_IDS = re.compile(rf"(?:{_ID}\n)*")


def pack_executions(executions: Iterable[ExecutionId]) -> list[str]:
    """``["rollout_id#attempt", ...]`` in the given order (a :class:`PackedExecutions` hands on
    the strings it holds: a hop that forwards a scope never unpacks it; a scope tuple is packed
    once for every remote participant it is sent to)."""
    if isinstance(executions, PackedExecutions):
        return executions.packed
    if isinstance(executions, tuple):
        return _packed_scope(executions)
    return _pack(executions)


def _pack(executions: Iterable[ExecutionId]) -> list[str]:
    return [f"{e.rollout_id}#{e.attempt}" for e in executions]


_packed_scope = ScopeMemo(_pack)


def pack_text(executions: Iterable[ExecutionId]) -> str:
    """The scope as one text, ``"rollout_id#attempt\n"`` per execution in the given order (the
    control routes' ``scope_text``): a JSON string of 100,000 ids parses in a millisecond, a
    list of them in about nine, and a hop that forwards it never splits it."""
    if isinstance(executions, PackedExecutions):
        return executions.text
    if isinstance(executions, tuple):
        return _text_scope(executions)
    return _joined(_pack(executions))


def _joined(items: list[str]) -> str:
    return "\n".join(items) + "\n" if items else ""


_text_scope = ScopeMemo(lambda scope: _joined(_pack(scope)))


class LazyExecutions(Sequence[ExecutionId]):
    """A sequence of executions built when first read (:meth:`_built`): what a control call
    hands on without reading, or an export lists after its freeze."""

    __slots__ = ()

    @abc.abstractmethod
    def _built(self) -> Sequence[ExecutionId]:
        """The executions (built on the first call, the same ones after)."""

    @overload
    def __getitem__(self, index: int) -> ExecutionId: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[ExecutionId]: ...
    def __getitem__(self, index: int | slice) -> ExecutionId | Sequence[ExecutionId]:
        return self._built()[index]

    def __len__(self) -> int:
        return len(self._built())

    def __iter__(self) -> Iterator[ExecutionId]:
        return iter(self._built())


class PackedExecutions(LazyExecutions):
    """A compact scope that :func:`check_packed` passed, unpacked into ``ExecutionId``s only when
    first read: a worker group's supervisor forwards its scope to the workers as it came, and a
    participant that never reads its scope (its export lists after the freeze) pays for it then.
    Do not change ``packed`` (the list is shared, not copied)."""

    __slots__ = ("_items", "_packed", "_text")

    def __init__(self, packed: list[str] | None = None, *, text: str | None = None) -> None:
        """From the strings (:func:`check_packed` passed) or from their text
        (:func:`check_packed_text` passed): exactly one of them."""
        if (packed is None) == (text is None):
            raise ValueError("PackedExecutions: give the strings or their text")
        self._packed = packed
        self._text = text
        self._items: list[ExecutionId] | None = None

    @property
    def packed(self) -> list[str]:
        """``["rollout_id#attempt", ...]`` (split from the text on first use)."""
        packed = self._packed
        if packed is None:
            assert self._text is not None
            packed = self._packed = self._text.split("\n")[:-1]  # every entry ends with "\n"
        return packed

    @property
    def text(self) -> str:
        """The same scope as :func:`pack_text` gives it (joined on first use)."""
        text = self._text
        if text is None:
            text = self._text = _joined(self.packed)
        return text

    def _built(self) -> list[ExecutionId]:
        items = self._items
        if items is None:  # two readers at once build the same list (the ids are interned)
            items = self._items = unpack_executions(self.packed, checked=True)
        return items

    def __len__(self) -> int:  # counted without unpacking
        return len(self._packed) if self._packed is not None else self.text.count("\n")

    def __repr__(self) -> str:
        return f"PackedExecutions({len(self)})"


def unpack_executions(
    items: Sequence[str], what: str = "scope", *, checked: bool = False
) -> list[ExecutionId]:
    """The executions of a compact list (order kept), or ``InvalidIdentifierError`` naming the
    first entry that is not ``<id>#<attempt>`` (``attempt`` a non-negative decimal integer).
    ``checked``: :func:`check_packed` already passed on ``items``."""
    if not checked:
        check_packed(items, what)
    global _largest
    _largest = max(_largest, len(items))
    known = _INTERNED.get
    out = []
    for item in items:
        execution = known(item)
        if execution is None:
            rollout_id, _, attempt = item.rpartition("#")
            execution = _intern(item, rollout_id, int(attempt))
        out.append(execution)
    return out


def check_packed(items: Sequence[str], what: str = "scope") -> None:
    """``InvalidIdentifierError`` naming the first entry of ``items`` that is not
    ``<id>#<attempt>``; one regular expression over the joined list when every entry is good."""
    if not isinstance(items, (list, tuple)):
        raise InvalidIdentifierError(f"{what} must be a list of 'rollout_id#attempt' strings")
    if not items:
        return
    joined = "\n".join(items) + "\n" if all(type(s) is str for s in items) else ""
    # one newline per entry: an entry holding a newline of its own is not one entry
    if not _PACKED.fullmatch(joined) or ".." in joined or joined.count("\n") != len(items):
        for i, item in enumerate(items):
            _one(item, f"{what}[{i}]")
        raise InvalidIdentifierError(f"{what}: an entry is not one 'rollout_id#attempt'")  # fail closed


def check_packed_text(text: str, what: str = "scope_text") -> None:
    """``InvalidIdentifierError`` naming the first entry of ``text`` that is not
    ``<id>#<attempt>`` followed by a newline (the form :func:`pack_text` gives); one regular
    expression over the text when every entry is good."""
    if not isinstance(text, str):
        raise InvalidIdentifierError(f"{what} must be one string of 'rollout_id#attempt' lines")
    if not text or (text.endswith("\n") and _PACKED.fullmatch(text) and ".." not in text):
        return
    entries = text.split("\n")
    if entries[-1] == "":
        entries.pop()
    for i, item in enumerate(entries):
        _one(item, f"{what}[{i}]")
    raise InvalidIdentifierError(f"{what}: the last entry does not end with a newline")  # fail closed


def _one(item: Any, what: str) -> None:
    if not isinstance(item, str):
        raise InvalidIdentifierError(
            f"{what} must be a 'rollout_id#attempt' string, got {type(item).__name__}"
        )
    rollout_id, sep, attempt = item.rpartition("#")
    if not sep or not re.fullmatch(_ATTEMPT, attempt):
        raise InvalidIdentifierError(f"{what} {item[:200]!r} is not 'rollout_id#attempt'", value=item[:200])
    validate_id(rollout_id, f"{what} rollout id")


def checked_pairs(raw: Any, what: str) -> list[tuple[str, int]]:
    """``[[rollout_id, attempt], ...]`` (a manifest's ``extra`` lists) as tuples, every id
    checked in one pass; ``InvalidValueError`` / ``InvalidIdentifierError`` naming the first bad one."""
    if not isinstance(raw, list):
        raise InvalidValueError(f"{what} must be a list of [rollout_id, attempt]")
    pairs: list[tuple[str, int]] = []
    for i, item in enumerate(raw):
        if (
            type(item) is not list
            or len(item) != 2
            or type(item[0]) is not str
            or type(item[1]) is not int
            or item[1] < 0
        ):
            raise InvalidValueError(f"{what}[{i}] is not [rollout_id, attempt >= 0]", value=repr(item)[:200])
        pairs.append((item[0], item[1]))
    if pairs:
        joined = "\n".join(p[0] for p in pairs) + "\n"
        if not _IDS.fullmatch(joined) or ".." in joined or joined.count("\n") != len(pairs):
            for i, (rollout_id, _) in enumerate(pairs):
                validate_id(rollout_id, f"{what}[{i}] rollout id")
            raise InvalidIdentifierError(f"{what}: an entry is not one rollout id")  # fail closed
    return pairs


INTERNED_MAX = 1 << 16
"""Execution ids kept for reuse (:func:`execution_ids`), or twice the largest scope unpacked
if that is more (a scope of 100,000 executions must stay whole between checkpoints: every one
rebuilt costs microseconds, at every hop); past it the cache starts again."""

_largest = 0  # the largest list unpacked (unpack_executions, execution_ids) so far

_INTERNED: dict[str, ExecutionId] = {}


def _intern(packed: str, rollout_id: str, attempt: int) -> ExecutionId:
    """The one ``ExecutionId`` of a checked pair, built through the model's pickle state (no
    validation again) and kept: a checkpoint's scope is mostly the previous one's, and every hop
    of a worker group unpacks it, so building a model per execution each time was most of what
    a scope of thousands cost. ``ExecutionId`` is frozen, so sharing one instance is safe."""
    execution = object.__new__(ExecutionId)
    execution.__setstate__(
        {
            "__dict__": {"rollout_id": rollout_id, "attempt": attempt},
            "__pydantic_fields_set__": {"rollout_id", "attempt"},
            "__pydantic_extra__": None,
            "__pydantic_private__": None,
        }
    )
    if len(_INTERNED) >= max(INTERNED_MAX, 2 * _largest):
        _INTERNED.clear()  # bounded: at most twice the largest scope unpacked, or INTERNED_MAX
    _INTERNED[packed] = execution
    return execution


def execution_ids(pairs: Iterable[tuple[str, int]]) -> list[ExecutionId]:
    """``ExecutionId``s of pairs already checked (:func:`checked_pairs`, :func:`check_packed`),
    without validating each one again, the same instance for the same pair while it is kept."""
    global _largest
    if isinstance(pairs, Sized):
        _largest = max(_largest, len(pairs))
    known = _INTERNED.get
    out = []
    for rollout_id, attempt in pairs:
        packed = f"{rollout_id}#{attempt}"
        execution = known(packed)
        if execution is None:
            execution = _intern(packed, rollout_id, attempt)
        out.append(execution)
    return out
