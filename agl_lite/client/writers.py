"""Row writers for `export`: JSON lines (always) and Parquet (the optional `pyarrow` extra), both streaming —
JSONL writes each row at once, Parquet one row group per `batch_rows` — and both writing to `OUT.partial`
renamed to OUT only on success, so a failed export never leaves a file that looks complete.
"""

from __future__ import annotations

import importlib
import os
from array import array
from pathlib import Path
from typing import IO, Any, Protocol

import orjson

from agl_lite.client.errors import MissingDependency

__all__ = ["FORMATS", "JsonlWriter", "ParquetWriter", "RowWriter", "open_writer"]

FORMATS = ("jsonl", "parquet")


class RowWriter(Protocol):
    def write(self, row: dict[str, Any]) -> None: ...
    def close(self, *, ok: bool) -> None:
        """Finish the file (ok) or remove what was written (not ok)."""
        ...


def _default(obj: Any) -> Any:
    if isinstance(obj, array):
        return obj.tolist()
    raise TypeError(f"cannot write {type(obj).__name__} as JSON")


class _Partial:
    """`path.partial` while writing; renamed to `path` on success, removed on failure."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tmp = path.with_name(path.name + ".partial")

    def finish(self, ok: bool) -> None:
        if ok:
            os.replace(self.tmp, self.path)
        else:
            self.tmp.unlink(missing_ok=True)


class JsonlWriter:
    """One JSON object per line; token ids and logprobs as JSON arrays."""

    def __init__(self, path: Path) -> None:
        self._partial = _Partial(path)
        self._file: IO[bytes] = open(self._partial.tmp, "wb")  # noqa: SIM115 — closed in close()

    def write(self, row: dict[str, Any]) -> None:
        self._file.write(orjson.dumps(row, default=_default, option=orjson.OPT_APPEND_NEWLINE))

    def close(self, *, ok: bool) -> None:
        self._file.close()
        self._partial.finish(ok)


def _pyarrow() -> tuple[Any, Any]:
    try:
        return importlib.import_module("pyarrow"), importlib.import_module("pyarrow.parquet")
    except ImportError:
        raise MissingDependency(
            "parquet export needs pyarrow: pip install 'agl-lite[parquet]' (or use --format jsonl)"
        ) from None


_LIST_COLUMNS = {"prompt_ids": "I", "response_ids": "I", "logprobs": "f", "response_mask": "B"}


def _trajectory_schema(pa: Any) -> list[tuple[str, Any]]:
    return [
        ("rollout_id", pa.string()),
        ("group_id", pa.string()),
        ("model_version", pa.string()),
        ("calls", pa.list_(pa.string())),
        ("prompt_ids", pa.list_(pa.uint32())),
        ("response_ids", pa.list_(pa.uint32())),
        ("response_mask", pa.list_(pa.uint8())),
        ("logprobs", pa.list_(pa.float32())),
        ("reward", pa.float64()),
        ("rollout_reward", pa.float64()),
        ("advantage", pa.float64()),
    ]


class ParquetWriter:
    """Columns as in the JSONL rows; token ids `list<uint32>`, logprobs `list<float32>`, `messages` as JSON text.
    `rows="trajectories"`: the columns of `agl_lite.integrations.export` (masks `list<uint8>`, advantages)."""

    def __init__(self, path: Path, *, batch_rows: int = 512, rows: str = "calls") -> None:
        self.pa, pq = _pyarrow()
        pa = self.pa
        self.schema = pa.schema(
            _trajectory_schema(pa)
            if rows == "trajectories"
            else [
                ("rollout_id", pa.string()),
                ("attempt_id", pa.string()),
                ("group_id", pa.string()),
                ("mode", pa.string()),
                ("call_id", pa.string()),
                ("seq", pa.int64()),
                ("order_key", pa.int64()),
                ("choice", pa.int64()),
                ("outcome", pa.string()),
                ("model", pa.string()),
                ("model_version", pa.string()),
                ("response_id", pa.string()),
                ("reward", pa.float64()),
                ("prompt_ids", pa.list_(pa.uint32())),
                ("response_ids", pa.list_(pa.uint32())),
                ("logprobs", pa.list_(pa.float32())),
                ("finish_reason", pa.string()),
                ("text", pa.string()),
                ("messages", pa.string()),
                ("labels", pa.map_(pa.string(), pa.string())),
            ]
        )
        self._partial = _Partial(path)
        self._writer = pq.ParquetWriter(str(self._partial.tmp), self.schema)
        self._rows: list[dict[str, Any]] = []
        self.batch_rows = batch_rows

    def write(self, row: dict[str, Any]) -> None:
        self._rows.append(row)
        if len(self._rows) >= self.batch_rows:
            self._flush()

    def _list_column(self, name: str, typecode: str) -> Any:
        """Built from the packed arrays' buffers: no Python int per token."""
        pa = self.pa
        flat = array(typecode)
        offsets = array("i", [0])
        valid = []
        for row in self._rows:
            values = row[name]
            valid.append(values is not None)
            if values is not None:
                same = isinstance(values, array) and values.typecode == typecode
                flat.extend(values if same else array(typecode, values))
            offsets.append(len(flat))
        value_type = {"I": pa.uint32(), "B": pa.uint8()}.get(typecode, pa.float32())
        values_arr = pa.Array.from_buffers(value_type, len(flat), [None, pa.py_buffer(flat)])
        mask = None if all(valid) else pa.array([not v for v in valid])
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values_arr, mask=mask)

    def _flush(self) -> None:
        if not self._rows:
            return
        pa = self.pa
        columns = []
        for field in self.schema:
            if field.name in _LIST_COLUMNS:
                columns.append(self._list_column(field.name, _LIST_COLUMNS[field.name]))
            elif field.name == "calls":
                columns.append(pa.array([r["calls"] for r in self._rows], field.type))
            elif field.name == "messages":
                texts = [
                    None if r["messages"] is None else orjson.dumps(r["messages"]).decode()
                    for r in self._rows
                ]
                columns.append(pa.array(texts, pa.string()))
            elif field.name == "labels":
                columns.append(pa.array([list(r["labels"].items()) for r in self._rows], field.type))
            else:
                columns.append(pa.array([r[field.name] for r in self._rows], field.type))
        self._writer.write_table(pa.Table.from_arrays(columns, schema=self.schema))
        self._rows.clear()

    def close(self, *, ok: bool) -> None:
        try:
            if ok:
                self._flush()
        finally:
            self._writer.close()
            self._partial.finish(ok)


def open_writer(path: Path, fmt: str, rows: str = "calls") -> RowWriter:
    """A writer of `rows` (`calls`: `export_calls`' rows; `trajectories`: `integrations.export`'s)."""
    if fmt == "jsonl":
        return JsonlWriter(path)
    if fmt == "parquet":
        return ParquetWriter(path, rows=rows)
    raise ValueError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
