"""The export of a kind that keeps its rows in an :class:`ExportRows` (the built-in agent,
policy-model and resources participants): the commit's scope set is built after the freeze."""

from __future__ import annotations

import abc
from collections.abc import Sequence

from ..ids import ExecutionId
from ._export_rows import ScopeSource, deferred_scope
from ._hooks import Export
from ._participant import Participant

__all__ = ["RowsExport"]


class RowsExport(Participant, abc.ABC):
    """Implement :meth:`_export_rows`: given the scope's set, or a function giving it (called
    when the rows are listed, after the freeze for an asynchronous commit). A subclass that
    overrides :meth:`_export` still gets the set first, as every kind does."""

    def _export(self, scope: frozenset[ExecutionId] | None) -> Export:
        return self._export_rows(scope)

    def _export_for(self, scope: Sequence[ExecutionId] | None) -> Export:
        if type(self)._export is not RowsExport._export:  # a subclass filters its own way
            return super()._export_for(scope)
        return self._export_rows(deferred_scope(scope))

    @abc.abstractmethod
    def _export_rows(self, scope: ScopeSource) -> Export:
        """The export, its listing filtered by ``scope`` (see :func:`resolve_scope`)."""
