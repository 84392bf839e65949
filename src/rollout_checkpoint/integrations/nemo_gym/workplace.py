"""The codec of Gym's ``workplace_assistant``: pandas DataFrames as Parquet, tools rebuilt by Gym.

A ``workplace_assistant`` session is Gym's ``get_tools(toolkits)`` result,
``{"containers": {toolkit: tool object}, "functions": {name: bound method}, "schemas": [...]}``:
each tool object keeps its data in pandas DataFrames (``EmailTool._emails``, ...), and the
functions are bound methods of those objects. :class:`WorkplaceAssistantCodec`:

* **encode** checks that every tool object holds exactly the DataFrame attributes Gym 0.7.0's
  tool of that name holds (anything else is refused: a Gym that grew new state must be audited
  first), and writes each DataFrame as one Parquet file (pyarrow, zstd, the index kept, the
  pandas dtypes in Parquet's pandas metadata). The session's bytes are a one-line canonical JSON
  header (``format``, the toolkits, and per frame its tool, attribute and byte length) followed
  by the Parquet files back to back. No JSON of the data, no pickle.
* **decode** parses the header, refuses anything not exactly that shape, rebuilds the tool
  objects through Gym's own factory (``get_tools(toolkits)``, so the bound methods and schemas
  are Gym's) and replaces each tool's DataFrames with the decoded ones.

The resources participant writes the bytes into the archive as they are (a binary
``resource_snapshot`` payload, see ``docs/format.md``), not as base64 inside JSON.
"""

from __future__ import annotations

import io
import json
import math
from typing import Any

__all__ = ["WORKPLACE_FRAMES", "WorkplaceAssistantCodec"]

FORMAT = "nemo-gym-workplace-parquet-1"

WORKPLACE_FRAMES: dict[str, tuple[str, ...]] = {
    "company_directory": ("_emails",),
    "email": ("_emails",),
    "calendar": ("_calendar_events",),
    "analytics": ("_analytics_data", "_plots_data"),
    "project_management": ("_project_tasks",),
    "customer_relationship_manager": ("_crm_data",),
}
"""The DataFrame attributes of each tool object of Gym 0.7.0's ``get_tools`` (the whole state
of a tool: each ``__init__`` only reads CSVs into these)."""

_ALWAYS = "company_directory"  # get_tools adds it whatever the toolkits


def _frame_bytes(frame: Any) -> tuple[bytes, dict[str, Any]]:
    """One DataFrame as a Parquet file, plus what Parquet's pandas metadata does not restore:
    which columns are ``object`` (pandas reads strings back as ``str``), which of those hold
    cells other than strings (stored as JSON text per cell), and where a null is ``None``
    rather than ``NaN``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not all(isinstance(c, str) for c in frame.columns) or len(set(frame.columns)) != len(frame.columns):
        raise ValueError("column names must be distinct strings")
    objects = [c for c in frame.columns if frame[c].dtype == object]
    json_columns: list[str] = []
    nones: dict[str, list[int]] = {}
    if objects:
        frame = frame.copy(deep=False)
        for column in objects:
            cells = frame[column].tolist()
            none_at = [i for i, v in enumerate(cells) if v is None]
            if none_at:
                nones[column] = none_at
            present = [v for v in cells if not _is_null(v)]
            if not all(isinstance(v, str) for v in present):
                json_columns.append(column)
                frame[column] = [None if _is_null(v) else json.dumps(v, sort_keys=True) for v in cells]
    # preserve_index=None: a RangeIndex as metadata, any other index as a column
    table = pa.Table.from_pandas(frame, preserve_index=None)
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd", compression_level=3, store_schema=True)
    return sink.getvalue(), {"object": objects, "json": json_columns, "none": nones}


def _is_null(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _frame(data: bytes, meta: dict[str, Any]) -> Any:
    import pyarrow as pa

    from ...archive import open_parquet_file  # reads on this thread only (see archive/_parquet_io)

    frame = open_parquet_file(pa.BufferReader(data)).read(use_threads=False).to_pandas()
    for column in meta["object"]:
        if column not in frame.columns:
            raise ValueError(f"column {column!r} is missing")
        cells = frame[column].astype(object).tolist()
        cells = [math.nan if _is_null(v) else v for v in cells]
        if column in meta["json"]:
            cells = [v if _is_null(v) else json.loads(v) for v in cells]
        for i in meta["none"].get(column, ()):
            if not 0 <= i < len(cells):
                raise ValueError(f"column {column!r} has no row {i}")
            cells[i] = None
        frame[column] = pd_series(cells, frame.index, frame[column].name)
    return frame


def pd_series(cells: list[Any], index: Any, name: Any) -> Any:
    import pandas as pd  # type: ignore[import-untyped]

    return pd.Series(cells, index=index, name=name, dtype=object)


def _check_meta(meta: Any) -> dict[str, Any]:
    if not isinstance(meta, dict) or set(meta) != {"object", "json", "none"}:
        raise ValueError("workplace_assistant frame metadata is not object/json/none")
    objects, json_columns, nones = meta["object"], meta["json"], meta["none"]
    if not isinstance(objects, list) or not all(isinstance(c, str) for c in objects):
        raise ValueError("workplace_assistant object columns must be names")
    if not isinstance(json_columns, list) or not set(json_columns) <= set(objects):
        raise ValueError("workplace_assistant JSON columns must be object columns")
    if (
        not isinstance(nones, dict)
        or not set(nones) <= set(objects)
        or not all(isinstance(v, list) and all(type(i) is int for i in v) for v in nones.values())
    ):
        raise ValueError("workplace_assistant None cells must be row positions of object columns")
    return meta


class WorkplaceAssistantCodec:
    """See the module docstring."""

    name = "nemo-gym-workplace-v1"

    def encode(self, state: Any) -> bytes:
        import pandas as pd

        if not isinstance(state, dict) or set(state) != {"containers", "functions", "schemas"}:
            raise TypeError("workplace_assistant state must be get_tools()'s dict")
        containers = state["containers"]
        if (
            not isinstance(containers, dict)
            or _ALWAYS not in containers
            or not set(containers) <= set(WORKPLACE_FRAMES)
        ):
            raise ValueError(f"workplace_assistant containers must be among {sorted(WORKPLACE_FRAMES)}")
        frames: list[dict[str, Any]] = []
        blobs: list[bytes] = []
        for tool in sorted(containers):
            attrs = vars(containers[tool])
            if set(attrs) != set(WORKPLACE_FRAMES[tool]):
                raise ValueError(
                    f"workplace_assistant {tool} holds {sorted(attrs)}, not {list(WORKPLACE_FRAMES[tool])} "
                    "(a Gym version whose tools keep other state needs its codec checked)"
                )
            for attr in WORKPLACE_FRAMES[tool]:
                frame = attrs[attr]
                if not isinstance(frame, pd.DataFrame):
                    raise TypeError(f"workplace_assistant {tool}.{attr} is not a DataFrame")
                try:
                    blob, meta = _frame_bytes(frame)
                except Exception as exc:  # pyarrow refuses a column it cannot type (ArrowInvalid, ...)
                    what = f"workplace_assistant {tool}.{attr}"
                    raise ValueError(f"{what} cannot be stored as Parquet: {exc}") from exc
                frames.append({"tool": tool, "attr": attr, "bytes": len(blob), **meta})
                blobs.append(blob)
        toolkits = sorted(t for t in containers if t != _ALWAYS)
        header = json.dumps(
            {"format": FORMAT, "toolkits": toolkits, "frames": frames}, sort_keys=True, separators=(",", ":")
        ).encode()
        return b"".join([header, b"\n", *blobs])

    def decode(self, data: bytes) -> Any:
        head, sep, body = bytes(data).partition(b"\n")
        if not sep:
            raise ValueError("workplace_assistant state has no header line")
        doc = json.loads(head)
        if not isinstance(doc, dict) or set(doc) != {"format", "toolkits", "frames"}:
            raise ValueError(f"workplace_assistant state is not {FORMAT}")
        if doc["format"] != FORMAT:
            raise ValueError(f"workplace_assistant state is not {FORMAT}")
        toolkits, frames = doc["toolkits"], doc["frames"]
        if (
            not isinstance(toolkits, list)
            or not all(isinstance(t, str) and t in WORKPLACE_FRAMES and t != _ALWAYS for t in toolkits)
            or len(set(toolkits)) != len(toolkits)
        ):
            raise ValueError("workplace_assistant toolkits are not Gym's")
        expected = [(t, a) for t in sorted([_ALWAYS, *toolkits]) for a in WORKPLACE_FRAMES[t]]
        if (
            not isinstance(frames, list)
            or [(f.get("tool"), f.get("attr")) if isinstance(f, dict) else None for f in frames] != expected
        ):
            raise ValueError("workplace_assistant frames do not match its toolkits")
        lengths = [f.get("bytes") for f in frames]
        if not all(type(n) is int and n > 0 for n in lengths) or sum(lengths) != len(body):
            raise ValueError("workplace_assistant frame lengths do not add up to the state's bytes")
        from resources_servers.workplace_assistant.utils import get_tools

        env: dict[str, Any] = get_tools(toolkits)  # Gym's factory: its tools, bound methods, schemas
        if set(env["containers"]) != {_ALWAYS, *toolkits}:
            raise ValueError("Gym's get_tools built other toolkits than the state names")
        frames_by = {(f["tool"], f["attr"]): f for f in frames}
        offset = 0
        for (tool, attr), length in zip(expected, lengths, strict=True):
            blob = body[offset : offset + length]
            offset += length
            meta = _check_meta({k: frames_by[(tool, attr)].get(k) for k in ("object", "json", "none")})
            try:
                frame = _frame(blob, meta)
            except Exception as exc:  # not a Parquet file
                raise ValueError(f"workplace_assistant {tool}.{attr} does not decode: {exc}") from exc
            setattr(env["containers"][tool], attr, frame)
        return env
