"""Streaming readers for dataset files: CSV, JSONL and Parquet, one record at a time.

Each reader yields `Record`s in file order and never holds more than one line (CSV, JSONL) or
one record batch (Parquet) in memory. Structural problems of a single record (bad JSON, a CSV row
with the wrong column count, a JSONL key set that differs from the first row) travel on the
record so a validator can report them all; problems that end reading (not UTF-8, not a Parquet
file, no CSV header) raise `FormatError`. The rules about what the fields mean live in
`osmosis.eval.inputs.dataset`.

Every reader applies `DatasetLimits` (see `osmosis.eval.inputs.dataset_limits`) before it holds
anything: a JSONL line or CSV line longer than the limit is a problem of its row (CSV: the
end of reading), not a line in memory; a Parquet file whose row count, column count, nesting
or decompressed size is over the limit is refused from its footer, and its batches are sized
so that one holds about `batch_bytes` of decompressed data.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osmosis.eval.inputs.dataset_limits import DEFAULT_LIMITS, DatasetLimits

__all__ = [
    "FORMATS",
    "FormatError",
    "Record",
    "RecordReader",
    "dataset_format",
    "loads_strict",
    "open_records",
    "sha256_file",
]

FORMATS = ("csv", "jsonl", "parquet")
# A workspace dataset is `data/<name><suffix>`, looked up in this order (one must match).
DATASET_SUFFIXES = (".jsonl", ".csv", ".parquet")
# Only these columns matter to eval; Parquet reads nothing else, to keep batches small.
KNOWN_COLUMNS = ("system_prompt", "user_prompt", "ground_truth", "label", "metadata")
PARQUET_BATCH_ROWS = 1024
# Bytes of a Parquet column chunk that are not values, at most: per chunk, and per row.
_PAGE_OVERHEAD = 64 * 1024
_ROW_OVERHEAD = 16
_CHUNK = 1 << 20
_BOM = b"\xef\xbb\xbf"


class FormatError(Exception):
    """The file cannot be read any further; `line` (1-based) says where, when known."""

    def __init__(self, message: str, *, line: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line


@dataclass(frozen=True)
class Record:
    """One data row as read from the file, before any dataset rule is applied.

    `row` is the 0-based source row index (blank lines do not count); `line` the 1-based line
    where the row starts (None for Parquet). `fields` is None when the row could not be parsed,
    and `problem` says what is structurally wrong with it.
    """

    row: int
    line: int | None
    fields: dict[str, Any] | None
    problem: str | None = None


@dataclass
class RecordReader:
    """An open dataset: its format, its columns (once known), and its records, streamed."""

    format: str
    records: Iterator[Record]
    columns: tuple[str, ...] = ()
    # Arrow type names for Parquet columns; text formats have no declared types.
    column_types: dict[str, str] = field(default_factory=dict)

    def __iter__(self) -> Iterator[Record]:
        return self.records

    def close(self) -> None:
        """Release the file now rather than when the reader is garbage-collected."""
        close = getattr(self.records, "close", None)
        if close is not None:
            close()


def dataset_format(path: str | Path) -> str:
    """The dataset format named by a file's extension, or `FormatError`.

    >>> dataset_format("data/multiply.jsonl")
    'jsonl'
    """
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in FORMATS:
        shown = f"'.{suffix}'" if suffix else "(none)"
        raise FormatError(f"Unsupported file type {shown}. Supported: {', '.join(FORMATS)}")
    return suffix


def loads_strict(text: str | bytes) -> Any:
    """`json.loads` that refuses NaN and Infinity, which are not JSON.

    >>> loads_strict('{"a": 1}')
    {'a': 1}
    """

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not valid JSON")

    return json.loads(text, parse_constant=refuse)


def open_records(
    path: str | Path,
    *,
    digest: Any = None,
    parse: bool = True,
    limits: DatasetLimits = DEFAULT_LIMITS,
) -> RecordReader:
    """Open a dataset file for streaming; `digest` (a hashlib object) sees every byte read.

    With `parse=False` JSONL lines are counted but not decoded (for fast fingerprints).

    >>> reader = open_records("data/multiply.jsonl")  # doctest: +SKIP
    >>> next(iter(reader)).fields["user_prompt"]  # doctest: +SKIP
    'What is 3 x 4?'
    """
    file_path = Path(path)
    kind = dataset_format(file_path)
    if kind == "parquet":
        return _parquet_reader(file_path, digest, limits)
    reader = RecordReader(format=kind, records=iter(()))
    reader.records = (_csv_records if kind == "csv" else _jsonl_records)(
        file_path, reader, digest, parse, limits
    )
    if kind == "csv":
        # Reading the header now makes `columns` known before the first row is asked for.
        first = next(reader.records, None)
        reader.records = _chain_first(first, reader.records)
    return reader


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks.

    >>> sha256_file("data/multiply.jsonl")  # doctest: +SKIP
    '9f86d08...'
    """
    digest = hashlib.sha256()
    _feed(Path(path), digest)
    return digest.hexdigest()


# -- text formats ----------------------------------------------------------------------------------
class _Hashing(io.RawIOBase):
    """A raw file that feeds every byte it reads to a digest, so hashing rides along the parse."""

    def __init__(self, handle: io.RawIOBase, digest: Any) -> None:
        super().__init__()
        self._handle = handle
        self._digest = digest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        count = self._handle.readinto(buffer)
        if count:
            self._digest.update(memoryview(buffer)[:count])
        return count or 0


def _lines(path: Path, digest: Any, max_bytes: int) -> Iterator[tuple[int, bytes | None]]:
    """Numbered raw lines (with their line ending); a digest, if given, sees the whole file.

    A line longer than `max_bytes` comes as None: it is read past, never held.
    """
    with path.open("rb", buffering=0) as raw:
        inner: io.RawIOBase = raw if digest is None else _Hashing(raw, digest)
        source = io.BufferedReader(inner, buffer_size=_CHUNK)
        number = 0
        while line := source.readline(max_bytes + 1):
            number += 1
            if len(line) > max_bytes and not line.endswith(b"\n"):
                while (rest := source.readline(_CHUNK)) and not rest.endswith(b"\n"):
                    pass  # the rest of an overlong line: counted by the digest, then dropped
                yield number, None
                continue
            yield number, line.removeprefix(_BOM) if number == 1 else line


def _long_line(limits: DatasetLimits) -> str:
    return (
        f"the line is longer than {limits.max_line_bytes:,} bytes (four times the "
        f"{limits.max_cell_bytes:,}-byte cell limit)"
    )


def _decode(number: int, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        message = f"not valid UTF-8 (byte {error.start} of the line); save the file as UTF-8"
        raise FormatError(message, line=number) from None


def _jsonl_records(
    path: Path, reader: RecordReader, digest: Any, parse: bool, limits: DatasetLimits
) -> Iterator[Record]:
    row = 0
    expected: frozenset[str] | None = None
    for number, raw in _lines(path, digest, limits.max_line_bytes):
        if raw is not None and not raw.strip():
            continue  # blank lines are not rows
        if not parse or raw is None:
            yield Record(row, number, None, None if raw is not None else _long_line(limits))
            row += 1
            continue
        value, problem = _json_object(_decode(number, raw), limits)
        if value is not None:
            keys = frozenset(value)
            if expected is None:
                # The first object defines the columns every later line must repeat exactly.
                expected = keys
                reader.columns = tuple(value)
            elif keys != expected:
                problem = _key_set_problem(expected, keys)
        yield Record(row, number, value, problem)
        row += 1


def _json_object(text: str, limits: DatasetLimits) -> tuple[dict[str, Any] | None, str | None]:
    """One JSONL line as an object, or why it is not one."""
    try:
        # Without the line ending, a decoder error's column stays on this line.
        value = loads_strict(text.rstrip("\r\n"))
    except json.JSONDecodeError as error:
        return None, f"invalid JSON: {error.msg} (column {error.colno})"
    except ValueError as error:  # NaN / Infinity
        return None, f"invalid JSON: {error}"
    except RecursionError:
        return None, f"invalid JSON: {limits.too_deep_to_read}"
    if not isinstance(value, dict):
        return None, f"each line must be a JSON object, got {type(value).__name__}"
    return value, None


def _key_set_problem(expected: frozenset[str], keys: frozenset[str]) -> str:
    parts = []
    if missing := sorted(expected - keys):
        parts.append(f"missing: {', '.join(missing)}")
    if extra := sorted(keys - expected):
        parts.append(f"extra: {', '.join(extra)}")
    return f"top-level fields differ from the first row ({'; '.join(parts)})"


def _csv_records(
    path: Path, reader: RecordReader, digest: Any, parse: bool, limits: DatasetLimits
) -> Iterator[Record]:
    _set_csv_field_limit(limits.max_cell_bytes)  # characters: never more than the bytes

    def text_lines() -> Iterator[str]:
        for number, raw in _lines(path, digest, limits.max_line_bytes):
            if raw is None:  # the csv module cannot resynchronise after a skipped line
                raise FormatError(_long_line(limits), line=number)
            yield _decode(number, raw)

    rows = csv.reader(text_lines(), strict=True)
    try:
        header = next(rows, None)
    except csv.Error as error:
        raise FormatError(f"unreadable CSV header ({_csv_error(error, limits)})", line=1) from None
    if not header or not any(name.strip() for name in header):
        raise FormatError("File has no header row", line=1)
    if duplicates := sorted({name for name in header if header.count(name) > 1}):
        raise FormatError(f"duplicate column names in the header: {', '.join(duplicates)}", line=1)
    if len(header) > limits.max_columns:
        raise FormatError(_too_many_columns(len(header), limits), line=1)
    reader.columns = tuple(header)
    yield from _csv_rows(rows, header, limits)


def _too_many_columns(count: int, limits: DatasetLimits) -> str:
    return f"the file has {count:,} columns; a dataset may have at most {limits.max_columns:,}"


def _csv_error(error: csv.Error, limits: DatasetLimits) -> str:
    if "field larger than field limit" in str(error):
        return f"a cell {limits.too_large}"
    return str(error)


def _csv_rows(rows: Any, header: list[str], limits: DatasetLimits) -> Iterator[Record]:
    row = 0
    start = rows.line_num + 1
    while True:
        try:
            cells = next(rows)
        except StopIteration:
            return
        except csv.Error as error:
            # The csv module cannot resynchronise after a broken quote: stop here.
            raise FormatError(
                f"malformed CSV ({_csv_error(error, limits)}); check the quoting of this row",
                line=start,
            ) from None
        line, start = start, rows.line_num + 1
        if not cells or (len(cells) == 1 and not cells[0].strip() and len(header) > 1):
            continue  # blank line
        if len(cells) != len(header):
            problem = f"expected {len(header)} columns, got {len(cells)}"
            yield Record(row, line, None, problem)
        else:
            yield Record(row, line, dict(zip(header, cells, strict=True)))
        row += 1


def _set_csv_field_limit(chars: int) -> None:
    # Prompts can be long (the csv module's default 128 KiB would reject them), but a quoted
    # cell spanning many lines must not grow without bound either.
    limit = min(chars, sys.maxsize)
    while True:
        try:
            csv.field_size_limit(limit)
            return
        except OverflowError:
            limit //= 2


def _chain_first(first: Record | None, rest: Iterator[Record]) -> Iterator[Record]:
    if first is not None:
        yield first
    yield from rest


# -- Parquet ---------------------------------------------------------------------------------------
def _parquet_reader(path: Path, digest: Any, limits: DatasetLimits) -> RecordReader:
    try:
        import pyarrow.parquet as pq  # type: ignore[import-untyped]
    except ImportError:  # pragma: no cover - pyarrow is a core dependency
        raise FormatError("reading Parquet needs pyarrow: pip install pyarrow") from None
    if digest is not None:
        # pyarrow reads the footer first and seeks around, so hash the bytes in their own pass.
        _feed(path, digest)
    try:
        parquet = pq.ParquetFile(path)
    except Exception as error:  # pyarrow raises several types for a corrupt file
        raise FormatError(f"Invalid parquet file: {error}") from None
    try:
        schema = parquet.schema_arrow
        columns = tuple(schema.names)
        wanted = [name for name in KNOWN_COLUMNS if name in columns]
        batch_rows = _parquet_footer_checks(parquet, columns, wanted, limits)
        types = {name: str(schema.field(name).type) for name in columns}
    except BaseException:
        parquet.close()
        raise
    records = _parquet_records(parquet, wanted, batch_rows, limits)
    return RecordReader("parquet", records, columns, types)


def _parquet_footer_checks(
    parquet: Any, columns: tuple[str, ...], wanted: list[str], limits: DatasetLimits
) -> int:
    """Refuse what the footer already shows to be too large; the rows per batch that keep a
    batch near `limits.batch_bytes` of decompressed data."""
    metadata = parquet.metadata
    if len(columns) > limits.max_columns:
        raise FormatError(_too_many_columns(len(columns), limits))
    if metadata.num_rows > limits.max_rows:
        raise FormatError(
            f"the file has {metadata.num_rows:,} rows; a dataset may have at most "
            f"{limits.max_rows:,}"
        )
    schema = parquet.schema_arrow
    for name in wanted:
        if _type_depth(schema.field(name).type) > limits.max_depth:
            raise FormatError(
                f"column {name} is nested more than {limits.max_depth} levels deep "
                "(structs and lists); flatten it"
            )
    total, batch_rows = 0, PARQUET_BATCH_ROWS
    for index in range(metadata.num_row_groups):
        group = metadata.row_group(index)
        sizes = dict.fromkeys(wanted, 0)
        for chunk in (group.column(column) for column in range(group.num_columns)):
            top = chunk.path_in_schema.split(".")[0]
            if top in sizes:
                # What is not a value: page headers, levels, lengths, dictionary indices.
                overhead = _PAGE_OVERHEAD + _ROW_OVERHEAD * group.num_rows
                sizes[top] += max(0, chunk.total_uncompressed_size - overhead)
                total += chunk.total_uncompressed_size
        for name, size in sizes.items():
            if group.num_rows and size // group.num_rows > limits.max_cell_bytes:
                # The average cell is over the limit, so some cell is: refuse unread, since
                # decompressing a page costs about three times its size.
                raise FormatError(
                    f"column {name} holds {size // group.num_rows:,} bytes per row on average "
                    f"in row group {index}; a cell may hold at most {limits.max_cell_bytes:,}"
                )
        size = sum(sizes.values())
        if size and group.num_rows:
            fitting = limits.batch_bytes * group.num_rows // size
            batch_rows = max(1, min(batch_rows, fitting))
    if total > limits.max_decompressed_bytes:
        raise FormatError(_decompressed_problem(total, limits))
    return batch_rows


def _decompressed_problem(size: int, limits: DatasetLimits) -> str:
    return (
        f"the columns eval reads decompress to {size:,} bytes; a Parquet dataset may "
        f"decompress to at most {limits.max_decompressed_bytes:,}"
    )


def _type_depth(arrow_type: Any) -> int:
    """How many struct/list/map levels an Arrow type nests, walked without recursion."""
    deepest = 0
    stack = [(arrow_type, 0)]
    while stack:
        kind, depth = stack.pop()
        children = [kind.field(i).type for i in range(kind.num_fields)]
        if children:
            depth += 1
            stack.extend((child, depth) for child in children)
        deepest = max(deepest, depth)
    return deepest


def _parquet_records(
    parquet: Any, wanted: list[str], batch_rows: int, limits: DatasetLimits
) -> Iterator[Record]:
    if not wanted:
        # Nothing eval reads: the rows still count, and the footer knows how many there are.
        for row in range(parquet.metadata.num_rows):
            yield Record(row, None, {})
        parquet.close()
        return
    row = 0
    decompressed = 0
    try:
        for batch in parquet.iter_batches(batch_size=batch_rows, columns=wanted):
            # The footer's sizes are the file's word; what was really decompressed counts too.
            decompressed += batch.nbytes
            if decompressed > limits.max_decompressed_bytes:
                raise FormatError(_decompressed_problem(decompressed, limits))
            for values in batch.to_pylist():
                yield Record(row, None, values)
                row += 1
    except (GeneratorExit, FormatError):
        raise
    except Exception as error:  # a truncated or corrupt page surfaces while reading
        raise FormatError(f"Invalid parquet file: cannot read row {row}: {error}") from None
    finally:
        parquet.close()
        _release_arrow_memory()


def _release_arrow_memory() -> None:
    # Arrow's allocator keeps freed pages for reuse; a server reads a large file rarely.
    import pyarrow as pa

    pa.default_memory_pool().release_unused()


def _feed(path: Path, digest: Any) -> None:
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
