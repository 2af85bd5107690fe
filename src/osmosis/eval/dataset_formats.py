"""Streaming readers for dataset files: CSV, JSONL and Parquet, one record at a time.

Each reader yields `Record`s in file order and never holds more than one line (CSV, JSONL) or
one record batch (Parquet) in memory. Structural problems of a single record (bad JSON, a CSV row
with the wrong column count, a JSONL key set that differs from the first row) travel on the
record so a validator can report them all; problems that end reading (not UTF-8, not a Parquet
file, no CSV header) raise `FormatError`. The rules about what the fields mean live in
`osmosis.eval.dataset`.
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
# Only these columns matter to eval; Parquet reads nothing else, to keep batches small.
KNOWN_COLUMNS = ("system_prompt", "user_prompt", "ground_truth", "label", "metadata")
PARQUET_BATCH_ROWS = 1024
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


def open_records(path: str | Path, *, digest: Any = None, parse: bool = True) -> RecordReader:
    """Open a dataset file for streaming; `digest` (a hashlib object) sees every byte read.

    With `parse=False` JSONL lines are counted but not decoded (for fast fingerprints).

    >>> reader = open_records("data/multiply.jsonl")  # doctest: +SKIP
    >>> next(iter(reader)).fields["user_prompt"]  # doctest: +SKIP
    'What is 3 x 4?'
    """
    file_path = Path(path)
    kind = dataset_format(file_path)
    if kind == "parquet":
        return _parquet_reader(file_path, digest)
    reader = RecordReader(format=kind, records=iter(()))
    reader.records = (_csv_records if kind == "csv" else _jsonl_records)(
        file_path, reader, digest, parse
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


def _lines(path: Path, digest: Any) -> Iterator[tuple[int, bytes]]:
    """Numbered raw lines (with their line ending); a digest, if given, sees the whole file."""
    with path.open("rb", buffering=0) as raw:
        inner: io.RawIOBase = raw if digest is None else _Hashing(raw, digest)
        source = io.BufferedReader(inner, buffer_size=_CHUNK)
        for number, line in enumerate(source, start=1):
            yield number, line.removeprefix(_BOM) if number == 1 else line


def _decode(number: int, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        message = f"not valid UTF-8 (byte {error.start} of the line); save the file as UTF-8"
        raise FormatError(message, line=number) from None


def _jsonl_records(path: Path, reader: RecordReader, digest: Any, parse: bool) -> Iterator[Record]:
    row = 0
    expected: frozenset[str] | None = None
    for number, raw in _lines(path, digest):
        if not raw.strip():
            continue  # blank lines are not rows
        if not parse:
            yield Record(row, number, None)
            row += 1
            continue
        value, problem = _json_object(_decode(number, raw))
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


def _json_object(text: str) -> tuple[dict[str, Any] | None, str | None]:
    """One JSONL line as an object, or why it is not one."""
    try:
        # Without the line ending, a decoder error's column stays on this line.
        value = loads_strict(text.rstrip("\r\n"))
    except json.JSONDecodeError as error:
        return None, f"invalid JSON: {error.msg} (column {error.colno})"
    except ValueError as error:  # NaN / Infinity
        return None, f"invalid JSON: {error}"
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


def _csv_records(path: Path, reader: RecordReader, digest: Any, parse: bool) -> Iterator[Record]:
    _raise_csv_field_limit()
    text_lines = (_decode(number, raw) for number, raw in _lines(path, digest))
    rows = csv.reader(text_lines, strict=True)
    try:
        header = next(rows, None)
    except csv.Error as error:
        raise FormatError(f"unreadable CSV header ({error})", line=1) from None
    if not header or not any(name.strip() for name in header):
        raise FormatError("File has no header row", line=1)
    if duplicates := sorted({name for name in header if header.count(name) > 1}):
        raise FormatError(f"duplicate column names in the header: {', '.join(duplicates)}", line=1)
    reader.columns = tuple(header)
    yield from _csv_rows(rows, header)


def _csv_rows(rows: Any, header: list[str]) -> Iterator[Record]:
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
                f"malformed CSV ({error}); check the quoting of this row", line=start
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


def _raise_csv_field_limit() -> None:
    # Prompts can be long; the csv module's default 128 KiB field limit would reject them.
    limit = sys.maxsize
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
def _parquet_reader(path: Path, digest: Any) -> RecordReader:
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
    schema = parquet.schema_arrow
    columns = tuple(schema.names)
    types = {name: str(schema.field(name).type) for name in columns}
    wanted = [name for name in KNOWN_COLUMNS if name in columns]
    records = _parquet_records(parquet, wanted)
    return RecordReader("parquet", records, columns, types)


def _parquet_records(parquet: Any, wanted: list[str]) -> Iterator[Record]:
    if not wanted:
        # Nothing eval reads: the rows still count, and the footer knows how many there are.
        for row in range(parquet.metadata.num_rows):
            yield Record(row, None, {})
        return
    row = 0
    try:
        for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=wanted):
            for values in batch.to_pylist():
                yield Record(row, None, values)
                row += 1
    except GeneratorExit:
        raise
    except Exception as error:  # a truncated or corrupt page surfaces while reading
        raise FormatError(f"Invalid parquet file: cannot read row {row}: {error}") from None
    finally:
        parquet.close()


def _feed(path: Path, digest: Any) -> None:
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
