"""Datasets: validate a file, fingerprint it, select rows, and stream them as prompts.

A dataset is a CSV, JSONL or Parquet file of named columns, in one of two modes:

* prompt mode (no `metadata` column): every row needs `user_prompt` and `ground_truth` (or its
  alias `label`); `system_prompt` is optional;
* metadata mode (a `metadata` column): every row needs a non-empty JSON object there (a JSON
  string in CSV/JSONL, a struct or JSON string in Parquet); prompt columns become optional.

Everything is streamed: memory grows with the rows selected, never with the file. Sizes,
row counts and nesting are bounded by `DatasetLimits` (`osmosis.eval.inputs.dataset_limits`).

>>> info = validate_dataset("data/multiply.jsonl")  # doctest: +SKIP
>>> selection = select_rows(info.rows, limit=5)  # doctest: +SKIP
>>> [row.messages for row in read_rows("data/multiply.jsonl", selection)]  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from osmosis.eval.inputs.dataset_checks import (
    MAX_REPORTED_PROBLEMS,
    DatasetError,
    Mode,
    Problem,
    Report,
    RowChecker,
    label_of,
    parse_metadata,
    text_of,
)
from osmosis.eval.inputs.dataset_formats import (
    FORMATS,
    FormatError,
    Record,
    dataset_format,
    open_records,
)
from osmosis.eval.inputs.dataset_limits import DEFAULT_LIMITS, DatasetLimits
from osmosis.eval.inputs.dataset_select import (
    SAMPLE_FRACTION,
    RowSpecError,
    Selection,
    parse_row_spec,
    select_rows,
)
from osmosis.vocabulary import format_bytes

__all__ = [
    "FORMATS",
    "MAX_FILE_BYTES",
    "MAX_REPORTED_PROBLEMS",
    "MIN_ROWS",
    "SAMPLE_FRACTION",
    "DatasetError",
    "DatasetFingerprint",
    "DatasetInfo",
    "DatasetLimits",
    "DatasetRow",
    "Problem",
    "RowSpecError",
    "Selection",
    "fingerprint_dataset",
    "parse_row_spec",
    "read_rows",
    "select_rows",
    "validate_dataset",
]

MIN_ROWS = 4
MAX_FILE_BYTES = 5 * 1024**3


# -- results and errors ----------------------------------------------------------------------------
@dataclass(frozen=True)
class DatasetRow:
    """One row as the engine uses it.

    `row_index` is the position in the selection (the number users see); `source_row_index`
    the row's offset in the file. `messages` holds the system message (when there is one) and
    then the user message. `label` is `ground_truth` (or `label`) as text, None when empty.
    """

    row_index: int
    source_row_index: int
    messages: list[dict[str, str]]
    label: str | None
    metadata: dict[str, Any] | None


@dataclass(frozen=True)
class DatasetInfo:
    """What `validate_dataset` learned about a valid file."""

    path: Path
    name: str  # the file stem: the dataset name configs refer to
    format: str
    mode: Mode
    columns: tuple[str, ...]
    rows: int
    size: int
    sha256: str
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class DatasetFingerprint:
    """Content hash, row count and size, computed in one streaming pass."""

    sha256: str
    rows: int
    size: int


# -- validation ------------------------------------------------------------------------------------
def validate_dataset(path: str | Path, *, limits: DatasetLimits = DEFAULT_LIMITS) -> DatasetInfo:
    """Check a dataset file against every format rule in one streaming pass.

    Raises `DatasetError` naming the first `MAX_REPORTED_PROBLEMS` problems (line, row, column,
    what is valid) and counting the rest. The SHA-256 is computed in the same pass.

    >>> info = validate_dataset("data/multiply.jsonl")  # doctest: +SKIP
    >>> info.mode, info.rows  # doctest: +SKIP
    ('prompt', 40)
    """
    file = Path(path)
    report = Report(file)
    try:
        kind = dataset_format(file)
        size = file.stat().st_size
    except FormatError as error:
        raise DatasetError(file, [Problem(error.message)]) from None
    except FileNotFoundError:
        raise DatasetError(file, [Problem("file not found")]) from None
    if size == 0:
        raise DatasetError(file, [Problem("File is empty")])
    if size > MAX_FILE_BYTES:
        limit = format_bytes(MAX_FILE_BYTES, exact=True)
        raise DatasetError(file, [Problem(f"File is {size:,} bytes; the maximum is {limit}")])
    digest = hashlib.sha256()
    checker: RowChecker | None = None
    rows = 0
    try:
        reader = open_records(file, digest=digest, limits=limits)
        checker = RowChecker(reader, report, limits)
        for record in reader:
            rows += 1
            if rows > limits.max_rows:
                reader.close()
                raise FormatError(
                    f"the file has more than {limits.max_rows:,} rows; a dataset may have at "
                    "most that many"
                )
            checker.check(record)
    except FormatError as error:
        report.add(Problem(error.message, line=error.line))
        report.fatal = True  # the row count below would be meaningless
    if rows < MIN_ROWS and not report.fatal:
        message = f"Dataset too small: {rows} rows. A minimum of {MIN_ROWS} rows is required."
        report.add(Problem(message))
    if report.total:
        raise DatasetError(file, report.problems, total=report.total)
    assert checker is not None and checker.mode is not None  # a valid file has rows and a mode
    return DatasetInfo(
        path=file,
        name=file.stem,
        format=kind,
        mode=checker.mode,
        columns=checker.columns,
        rows=rows,
        size=size,
        sha256=digest.hexdigest(),
        warnings=tuple(checker.warnings()),
    )


# -- reading ---------------------------------------------------------------------------------------
def fingerprint_dataset(
    path: str | Path, *, limits: DatasetLimits = DEFAULT_LIMITS
) -> DatasetFingerprint:
    """SHA-256, row count and size of a dataset file in one streaming pass (no validation).

    >>> fingerprint_dataset("data/multiply.jsonl").rows  # doctest: +SKIP
    40
    """
    file = Path(path)
    digest = hashlib.sha256()
    try:
        rows = sum(1 for _ in open_records(file, digest=digest, parse=False, limits=limits))
    except FormatError as error:
        raise DatasetError(file, [Problem(error.message, line=error.line)]) from None
    return DatasetFingerprint(digest.hexdigest(), rows, file.stat().st_size)


def read_rows(
    path: str | Path,
    selection: Selection | Sequence[int] | None = None,
    *,
    limits: DatasetLimits = DEFAULT_LIMITS,
) -> Iterator[DatasetRow]:
    """Stream rows as `DatasetRow`s: all of them, or only the selected source rows, in order.

    Selected rows are renumbered: the i-th selected row gets `row_index` i. A selected row that
    breaks a dataset rule raises `DatasetError` (validate the file first to see every problem).

    >>> rows = read_rows("data/x.csv", select_rows(10, rows="3,7"))  # doctest: +SKIP
    >>> [(r.row_index, r.source_row_index) for r in rows]  # doctest: +SKIP
    [(0, 3), (1, 7)]
    """
    file = Path(path)
    wanted = None if selection is None else _wanted(selection)
    position = 0
    try:
        reader = open_records(file, limits=limits)
    except FormatError as error:
        raise DatasetError(file, [Problem(error.message, line=error.line)]) from None
    checker = RowChecker(reader, Report(file), limits)
    try:
        for record in reader:
            if wanted is not None:
                if position >= len(wanted):
                    return  # past the last selected row: stop reading the file
                if record.row != wanted[position]:
                    continue
            row_index = record.row if wanted is None else position
            yield _to_row(checker, record, row_index=row_index)
            position += 1
    except FormatError as error:
        raise DatasetError(file, [Problem(error.message, line=error.line)]) from None
    finally:
        reader.close()
    if wanted is not None and position < len(wanted):
        missing = wanted[position]
        raise DatasetError(file, [Problem(f"selected row {missing} is past the end of the file")])


def _wanted(selection: Selection | Sequence[int]) -> list[int]:
    rows = selection.rows if isinstance(selection, Selection) else selection
    ordered = list(rows)
    if ordered != sorted(set(ordered)):
        raise ValueError("selected rows must be ascending source row indices without repeats")
    return ordered


def _to_row(checker: RowChecker, record: Record, *, row_index: int) -> DatasetRow:
    report = checker.report
    checker.check(record)
    if report.total:
        raise DatasetError(report.path, report.problems, total=report.total)
    fields = record.fields or {}
    messages = []
    if system := text_of(fields.get("system_prompt")):
        messages.append({"role": "system", "content": system})
    if isinstance(user := fields.get("user_prompt"), str) and user:
        messages.append({"role": "user", "content": user})
    metadata = None
    if checker.mode == "metadata":
        metadata, _ = parse_metadata(fields.get("metadata"))
    return DatasetRow(row_index, record.row, messages, label_of(fields), metadata)
