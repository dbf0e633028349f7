"""Table files someone else wrote (Parquet, Arrow IPC): their decoded size bounded before it is decoded.

A few KB of Parquet can claim billions of rows, or hold one dictionary value that a million rows
repeat; a few KB of compressed Arrow IPC can decompress to gigabytes. So the Parquet footer's row
count and uncompressed size are checked first, rows are read in batches with text columns kept
dictionary-encoded (each row's decoded size is known before it is decoded), and an IPC file's
record batches are sized from their own metadata (each compressed buffer states its decompressed
length) before any is read. Problems raise `safefiles.NotReadable` with the limit in words.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hetprof.safety.safefiles import NotReadable, open_regular


@dataclasses.dataclass(frozen=True)
class TableLimits:
    """What one table file may hold once decoded."""

    rows: int
    bytes: int  # decoded bytes of the whole table
    row_bytes: int  # decoded bytes of one row's text


def parquet_rows(path: str | Path, limits: TableLimits, batch_rows: int = 1024) -> Iterator[list[dict[str, Any]]]:
    """The rows of a Parquet file as lists of dicts, batch by batch, each batch checked before decoding."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with open_regular(path) as f:
        try:
            # every byte-array leaf, nested ones (a struct's field, a list's items) included, by its path
            texts = [c.path for c in pq.read_metadata(f).schema if c.physical_type == "BYTE_ARRAY"]
            f.seek(0)
            pf = pq.ParquetFile(f, read_dictionary=texts)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise NotReadable(f"not a readable Parquet file ({_first_line(exc)})") from None
        meta = pf.metadata
        if meta.num_rows > limits.rows:
            raise NotReadable(f"{meta.num_rows:,} rows (its footer says), more than the {limits.rows:,} read")
        size = sum(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups))
        if size > limits.bytes:
            raise NotReadable(f"{size:,} bytes uncompressed (its footer says), more than {limits.bytes:,}")
        budget = _Budget(limits)
        try:
            for batch in pf.iter_batches(batch_size=batch_rows):
                budget.take(batch)
                yield batch.to_pylist()
        except (pa.ArrowException, OSError) as exc:
            raise NotReadable(f"not a readable Parquet file ({_first_line(exc)})") from None


class _Budget:
    """Rows and decoded bytes taken so far; a batch over the limits is refused before it is decoded."""

    def __init__(self, limits: TableLimits):
        self.limits, self.rows, self.bytes = limits, 0, 0

    def take(self, batch: Any) -> None:
        sizes = row_sizes(batch)
        self.rows += batch.num_rows
        if self.rows > self.limits.rows:
            raise NotReadable(f"more than {self.limits.rows:,} rows")
        biggest = max(sizes, default=0)
        if biggest > self.limits.row_bytes:
            row = self.rows - batch.num_rows + sizes.index(biggest) + 1
            raise NotReadable(f"row {row} holds {biggest:,} bytes, more than the {self.limits.row_bytes:,} of a row")
        self.bytes += sum(sizes)
        if self.bytes > self.limits.bytes:
            raise NotReadable(f"more than {self.limits.bytes:,} bytes once decoded")


def row_sizes(batch: Any) -> list[int]:
    """Decoded bytes of each row of a record batch, computed without decoding dictionary columns."""
    sizes = [0] * batch.num_rows
    for column in batch.columns:
        for i, n in enumerate(_value_sizes(column)):
            sizes[i] += n
    return sizes


def _value_sizes(array: Any) -> list[int]:
    """Decoded bytes of each value of an array; structs and lists sum their children's, so a dictionary
    nested in them is sized from its indices like a top-level one."""
    import pyarrow as pa
    import pyarrow.compute as pc

    tp = array.type
    if pa.types.is_dictionary(tp) and _is_text(tp.value_type):
        lengths = pc.take(pc.binary_length(array.dictionary), array.indices)
    elif _is_text(tp):
        lengths = pc.binary_length(array)
    elif pa.types.is_struct(tp):
        fields = [_value_sizes(child) for child in array.flatten()]
        return [sum(parts) for parts in zip(*fields, strict=True)] if fields else [0] * len(array)
    elif pa.types.is_list(tp) or pa.types.is_large_list(tp):
        items, counts = iter(_value_sizes(array.flatten())), pc.fill_null(pc.list_value_length(array), 0)
        return [sum(next(items) for _ in range(n)) for n in counts.to_pylist()]
    else:  # fixed-width values are held decoded already: spread their bytes over the rows
        share = array.nbytes // max(1, len(array))
        return [share] * len(array)
    return pc.fill_null(lengths, 0).to_pylist()


def _is_text(tp: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_string(tp) or pa.types.is_large_string(tp) or pa.types.is_binary(tp) \
        or pa.types.is_large_binary(tp)


# ---- Arrow IPC: decoded sizes from each record batch's flatbuffer metadata ------------------------

IPC_MAGIC = b"ARROW1"


def check_ipc(path: str | Path, limits: TableLimits) -> None:
    """Refuse an Arrow IPC file (stream or file format) whose record and dictionary batches would
    decode past `limits`, reading only their metadata and the 8-byte length heads of compressed buffers."""
    import pyarrow as pa

    rows = decoded = 0
    with open_regular(path) as f:
        if f.read(len(IPC_MAGIC)) == IPC_MAGIC:
            f.seek(8)  # the file format is the stream format after an 8-byte magic
        else:
            f.seek(0)
        try:
            reader = pa.ipc.MessageReader.open_stream(f)
            for message in reader:
                if message.type not in ("record batch", "dictionary batch"):
                    continue
                n, size = _batch_size(message.metadata.to_pybytes(), message.body, message.type)
                rows += n if message.type == "record batch" else 0
                decoded += size
                if rows > limits.rows:
                    raise NotReadable(f"more than {limits.rows:,} rows")
                if decoded > limits.bytes:
                    raise NotReadable(f"more than {limits.bytes:,} bytes once decompressed")
        except (pa.ArrowException, OSError, struct.error, IndexError) as exc:
            raise NotReadable(f"not a readable Arrow IPC file ({_first_line(exc)})") from None


def _batch_size(meta: bytes, body: Any, kind: str) -> tuple[int, int]:
    """(rows, decoded body bytes) of one IPC message, from its flatbuffer `Message` metadata."""
    message = _Table(meta, _u32(meta, 0))
    header = message.table(2)
    if kind == "dictionary batch":
        header = header.table(1) if header else None  # DictionaryBatch.data: a RecordBatch
    if header is None:
        raise NotReadable("not a readable Arrow IPC file (a batch without its header)")
    rows = header.i64(0)
    compressed = header.field(3) is not None  # RecordBatch.compression
    total = 0
    vector = header.field(2)  # RecordBatch.buffers: [struct {offset: i64, length: i64}]
    if vector is not None:
        start = vector + _u32(meta, vector)
        for i in range(_u32(meta, start)):
            offset, length = struct.unpack_from("<qq", meta, start + 4 + 16 * i)
            if compressed and length >= 8:
                (plain,) = struct.unpack("<q", body[offset:offset + 8].to_pybytes())
                total += length - 8 if plain == -1 else max(plain, 0)
            else:
                total += length
    return rows, total


def _u32(buf: bytes, pos: int) -> int:
    return struct.unpack_from("<I", buf, pos)[0]


class _Table:
    """A flatbuffer table: field i's absolute position, or None when it is absent."""

    def __init__(self, buf: bytes, pos: int):
        self.buf, self.pos = buf, pos
        self.vtable = pos - struct.unpack_from("<i", buf, pos)[0]
        self.vsize = struct.unpack_from("<H", buf, self.vtable)[0]

    def field(self, i: int) -> int | None:
        slot = 4 + 2 * i
        if slot >= self.vsize:
            return None
        offset = struct.unpack_from("<H", self.buf, self.vtable + slot)[0]
        return self.pos + offset if offset else None

    def table(self, i: int) -> _Table | None:
        at = self.field(i)
        return None if at is None else _Table(self.buf, at + _u32(self.buf, at))

    def i64(self, i: int) -> int:
        at = self.field(i)
        return 0 if at is None else struct.unpack_from("<q", self.buf, at)[0]


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
