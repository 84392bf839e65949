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

__all__ = ["open_parquet_file", "open_parquet_writer", "read_footer_metadata"]

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
    """``pyarrow.parquet.ParquetFile`` over ``source`` (a file object or an Arrow input stream)
    that reads on the calling thread only: no read is handed to Arrow's I/O thread pool, so no
    native thread ever calls into ``source`` or holds a reference to it (see the module
    docstring). Decode with ``use_threads=False`` too, which keeps Arrow's CPU pool out."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(source, metadata=metadata, pre_buffer=False)
