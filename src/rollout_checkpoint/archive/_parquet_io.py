"""Parquet writing and footer parsing without importing ``pyarrow.parquet``.

``pyarrow.parquet`` imports ``pyarrow.fs`` and with it the S3, GCS, Azure and HDFS filesystem
bindings: about 10 MB of resident memory that a writer streaming into its own sinks never uses
(issue 9 counts the imports in the writer's peak RSS). Its ``ParquetWriter`` only resolves a
filesystem and then builds ``pyarrow._parquet.ParquetWriter`` with the same options, so the
writer builds that directly; the bytes are identical (``tests/test_archive_bulk.py`` checks
this). If a pyarrow version changes the private constructor, the public class is used instead.

Every Parquet file the SDK reads is opened by :func:`open_parquet_file`: it decodes on the
calling thread only. pyarrow's default (``pre_buffer=True``) hands the reads to Arrow's I/O
thread pool; over a Python file object (a store's ``open_read`` stream) those native threads then
take the GIL to call its ``read`` and, now and then, drop the last reference to it. One that does
so while the interpreter finalizes is ended by CPython from inside a C++ destructor, and the
process aborts (``terminate called without an active exception``) after its work was done.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

__all__ = ["ParquetSource", "open_parquet_file", "open_parquet_writer", "read_footer_metadata"]

_DEFAULTS = {"version": "2.6", "writer_engine_version": "V2"}


def open_parquet_writer(sink: Any, schema: pa.Schema, **options: Any) -> Any:
    """A Parquet writer over ``sink`` (a file object or an Arrow output stream); ``options`` are
    ``pyarrow.parquet.ParquetWriter``'s."""
    try:
        from pyarrow._parquet import ParquetWriter
    except ImportError:  # pragma: no cover - every supported pyarrow has it
        ParquetWriter = None
    if ParquetWriter is not None:
        try:
            return ParquetWriter(sink, schema, **_DEFAULTS, **options)
        except TypeError:  # pragma: no cover - a pyarrow whose private signature differs
            pass
    import pyarrow.parquet as pq  # pragma: no cover

    return pq.ParquetWriter(sink, schema, **options)  # pragma: no cover


def read_footer_metadata(source: pa.NativeFile) -> Any:
    """The ``FileMetaData`` of the Parquet file in ``source`` (``pq.read_metadata`` without
    ``pyarrow.parquet``)."""
    from pyarrow._parquet import ParquetReader

    reader = ParquetReader()
    reader.open(source)
    return reader.metadata


def open_parquet_file(source: Any, *, metadata: Any = None) -> Any:
    """The reading half of ``pyarrow.parquet.ParquetFile`` over ``source`` (a file object or an
    Arrow input stream) that reads on the calling thread only: no read is handed to Arrow's I/O
    thread pool, so no native thread ever calls into ``source`` or holds a reference to it (see
    the module docstring). Decode with ``use_threads=False`` too, which keeps Arrow's CPU pool out.

    Built on ``pyarrow._parquet.ParquetReader`` as ``ParquetFile`` is, without importing
    ``pyarrow.parquet`` (and with it ``pyarrow.fs``, the filesystem bindings and ``ssl``: about
    20-40 ms that a cold lookup of one member would otherwise pay, and their memory). If a pyarrow
    version changes the private reader, the public class is used instead."""
    try:
        return ParquetSource(source, metadata=metadata)
    except (ImportError, TypeError):  # pragma: no cover - a pyarrow whose private API differs
        import pyarrow.parquet as pq

        return pq.ParquetFile(source, metadata=metadata, pre_buffer=False)


class ParquetSource:
    """``metadata``, ``schema_arrow``, ``num_row_groups``, ``read``, ``read_row_group`` and
    ``read_row_groups`` of ``pyarrow.parquet.ParquetFile`` (columns by name, nested ones by
    their top-level name as there), over ``pyarrow._parquet.ParquetReader``."""

    def __init__(self, source: Any, *, metadata: Any = None) -> None:
        from pyarrow._parquet import ParquetReader

        reader = ParquetReader()
        reader.open(
            source,
            use_memory_map=False,
            buffer_size=0,
            pre_buffer=False,
            metadata=metadata,
            arrow_extensions_enabled=True,  # as ParquetFile
        )
        self.reader = reader
        self._paths: dict[str, list[int]] = {}
        for i, path in enumerate(reader.column_paths):  # as ParquetFile._build_nested_paths
            for depth in range(1, len(path) + 1):
                self._paths.setdefault(".".join(path[:depth]), []).append(i)

    @property
    def metadata(self) -> Any:
        return self.reader.metadata

    @property
    def schema_arrow(self) -> pa.Schema:
        return self.reader.schema_arrow

    @property
    def num_row_groups(self) -> int:
        return int(self.reader.num_row_groups)

    def _indices(self, columns: list[str] | None) -> list[int] | None:
        if columns is None:
            return None
        return [i for name in columns for i in self._paths.get(name, [])]

    def read(self, columns: list[str] | None = None, use_threads: bool = True) -> pa.Table:
        return self.reader.read_all(column_indices=self._indices(columns), use_threads=use_threads)

    def read_row_group(self, i: int, columns: list[str] | None = None, use_threads: bool = True) -> pa.Table:
        return self.reader.read_row_group(i, column_indices=self._indices(columns), use_threads=use_threads)

    def read_row_groups(
        self, row_groups: list[int], columns: list[str] | None = None, use_threads: bool = True
    ) -> pa.Table:
        return self.reader.read_row_groups(
            row_groups, column_indices=self._indices(columns), use_threads=use_threads
        )
