"""The dataset rules, applied one record at a time, and the problems they report.

`RowChecker` decides the mode from the columns (prompt mode, or metadata mode when a `metadata`
column exists), checks each row, and remembers the one thing that must agree across rows: the
JSON type at each metadata key path. Every cell (and every JSONL column name) is also held to
`DatasetLimits`: no NUL, no lone surrogate, bounded size and nesting. `Report` keeps the first
problems and counts the rest.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from osmosis.eval.inputs.dataset_formats import KNOWN_COLUMNS, Record, RecordReader, loads_strict
from osmosis.eval.inputs.dataset_limits import DEFAULT_LIMITS, DatasetLimits, cell_problem

__all__ = [
    "MAX_REPORTED_PROBLEMS",
    "DatasetError",
    "Mode",
    "Problem",
    "Report",
    "RowChecker",
    "label_of",
    "parse_metadata",
    "text_of",
]

MAX_REPORTED_PROBLEMS = 20
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
Mode = Literal["prompt", "metadata"]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a dataset: where (line, 0-based row, column) and what is valid."""

    message: str
    line: int | None = None
    row: int | None = None
    column: str | None = None

    def format(self, path: str | Path) -> str:
        parts = [f"{path}:{self.line}" if self.line is not None else str(path)]
        if self.row is not None:
            parts.append(f"row {self.row}")
        if self.column:
            parts.append(self.column)
        return ": ".join([*parts, self.message])

    def as_dict(self) -> dict[str, Any]:
        return {"line": self.line, "row": self.row, "column": self.column, "message": self.message}


class DatasetError(Exception):
    """A dataset that cannot be used: the first problems in file order and how many there were.

    >>> print(DatasetError("d.csv", [Problem("Dataset too small: 2 rows.")]))
    Invalid dataset d.csv (1 problem):
      d.csv: Dataset too small: 2 rows.
    """

    def __init__(
        self, path: str | Path, problems: Sequence[Problem], *, total: int | None = None
    ) -> None:
        self.path = str(path)
        self.problems = list(problems)
        self.total = max(total or 0, len(self.problems))
        super().__init__(str(self))

    def __str__(self) -> str:
        noun = "problem" if self.total == 1 else "problems"
        lines = [f"Invalid dataset {self.path} ({self.total} {noun}):"]
        lines += [f"  {problem.format(self.path)}" for problem in self.problems]
        if self.total > len(self.problems):
            lines.append(f"  ... and {self.total - len(self.problems)} more")
        return "\n".join(lines)


class Report:
    """Keeps the first problems in file order and counts the rest."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.problems: list[Problem] = []
        self.total = 0
        self.fatal = False

    def add(self, problem: Problem) -> None:
        self.total += 1
        if len(self.problems) < MAX_REPORTED_PROBLEMS:
            self.problems.append(problem)


class RowChecker:
    """Applies the per-row rules and remembers what must agree across rows."""

    def __init__(
        self, reader: RecordReader, report: Report, limits: DatasetLimits = DEFAULT_LIMITS
    ) -> None:
        self.reader = reader
        self.report = report
        self.limits = limits
        self.mode: Mode | None = None
        self.columns: tuple[str, ...] = ()
        self.missing: set[str] = set()
        # JSON type of each metadata key path, with the line/row where it was first seen.
        self.types: dict[str, tuple[str, str]] = {}

    def start(self, record: Record) -> None:
        """Decide the mode from the columns, once they are known (JSONL: at the first object)."""
        self.columns = self.reader.columns
        self.mode = "metadata" if "metadata" in self.columns else "prompt"
        where = 1 if self.reader.format == "csv" else record.line
        if self.mode == "prompt":
            needed = []
            if "user_prompt" not in self.columns:
                needed.append("user_prompt")
                self.missing.add("user_prompt")
            if "ground_truth" not in self.columns and "label" not in self.columns:
                needed.append("ground_truth (or label)")
                self.missing.add("ground_truth")
            if needed:
                # Said once for the file rather than once per row.
                self.report.add(
                    Problem(
                        f"Missing required columns: {', '.join(needed)}. A dataset needs "
                        "user_prompt and ground_truth (or label), or a metadata column",
                        line=where,
                    )
                )
        self.check_column_types()

    def check_column_types(self) -> None:
        types = self.reader.column_types
        meta = types.get("metadata")
        if meta is not None and not (meta.startswith("struct") or _is_text_type(meta)):
            message = f"must be a struct or a JSON string column, got {meta}"
            self.report.add(Problem(message, column="metadata"))
            self.missing.add("metadata")
        for name in ("user_prompt", "system_prompt"):
            kind = types.get(name)
            if kind is not None and not _is_text_type(kind) and kind != "null":
                self.report.add(Problem(f"must be a string column, got {kind}", column=name))
                self.missing.add(name)

    def check(self, record: Record) -> None:
        if record.problem is not None:
            self.report.add(Problem(record.problem, line=record.line, row=record.row))
        if record.fields is None:
            return
        if self.mode is None:
            self.start(record)
        unusable = dict(self.cell_problems(record.fields))
        for column, message in [*unusable.items(), *self.row_problems(record, unusable)]:
            self.report.add(Problem(message, line=record.line, row=record.row, column=column))

    def cell_problems(self, fields: dict[str, Any]) -> Iterator[tuple[str, str]]:
        """(column, problem) for each cell the limits refuse, and for a refused column name."""
        for column, value in fields.items():
            if (named := cell_problem(column, self.limits)) is not None:
                yield _shown(column), f"the column name {named}"
            elif (problem := cell_problem(value, self.limits)) is not None:
                yield column, problem

    def row_problems(
        self, record: Record, unusable: dict[str, str] | None = None
    ) -> Iterator[tuple[str, str]]:
        fields = record.fields or {}
        # A row whose key set is already reported wrong is not blamed again for a missing key.
        blame_absent = record.problem is None

        def judged(name: str, *keys: str) -> bool:
            present = any(key in fields for key in keys or (name,))
            # A cell already refused (too deep, too large) is not walked again.
            fine = name not in self.missing and name not in (unusable or {})
            return fine and (present or blame_absent)

        if self.mode == "prompt":
            if judged("user_prompt") and text_of(fields.get("user_prompt")) is None:
                yield "user_prompt", _expected_text(fields.get("user_prompt"), "a non-empty")
            if judged("ground_truth", "ground_truth", "label") and label_of(fields) is None:
                yield "ground_truth", "needs a non-empty ground_truth (or label) value"
        else:
            if judged("metadata"):
                yield from self.metadata_problems(fields.get("metadata"), record)
            if _not_text("user_prompt", fields) and "user_prompt" not in self.missing:
                yield "user_prompt", _expected_text(fields["user_prompt"], "a")
        if _not_text("system_prompt", fields) and "system_prompt" not in self.missing:
            yield "system_prompt", _expected_text(fields["system_prompt"], "a")

    def metadata_problems(self, value: Any, record: Record) -> Iterator[tuple[str, str]]:
        parsed, problem = parse_metadata(value, self.limits)
        if problem is None and isinstance(value, str):
            problem = cell_problem(parsed, self.limits)  # a JSON string: its parsed value
        if problem is not None:
            yield "metadata", problem
            return
        assert parsed is not None
        here = f"line {record.line}" if record.line is not None else f"row {record.row}"
        for path, kind, problem in _json_types(parsed):
            if problem is not None:
                yield "metadata", f"{problem} at {path}"
                continue
            first = self.types.setdefault(path, (kind, here))
            if first[0] != kind:
                yield (
                    "metadata",
                    f"value type at {path} is inconsistent across rows ({first[0]} at "
                    f"{first[1]} vs {kind} here); use one JSON type per key",
                )

    def warnings(self) -> list[str]:
        notes = []
        if "ground_truth" in self.columns and "label" in self.columns:
            notes.append("both ground_truth and label columns exist; ground_truth is used first")
        ignored = [c for c in self.columns if c not in KNOWN_COLUMNS]
        if ignored:
            notes.append(f"columns ignored by eval: {', '.join(ignored)}")
        return notes


def _is_text_type(arrow_type: str) -> bool:
    # Dictionary-encoded strings (pandas categoricals) read back as plain strings.
    plain = ("string", "large_string", "string_view")
    return arrow_type in plain or any(
        arrow_type.startswith(f"dictionary<values={kind},") for kind in plain
    )


def text_of(value: Any) -> str | None:
    """`value` when it is a string with something besides whitespace, else None."""
    return value if isinstance(value, str) and value.strip() else None


def _expected_text(value: Any, article: str) -> str:
    got = "missing" if value is None else f"got {type(value).__name__} {_short(value)}"
    return f"must be {article} string ({got})"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _shown(name: str) -> str:
    """A column name fit to print: escapes instead of NUL or surrogates, and cut short."""
    text = name.encode("unicode_escape").decode("ascii")
    return text if len(text) <= 80 else text[:77] + "..."


def _not_text(name: str, fields: dict[str, Any]) -> bool:
    """True when an optional text field holds something other than a string or null."""
    value = fields.get(name)
    return value is not None and not isinstance(value, str)


def label_of(fields: dict[str, Any]) -> str | None:
    """`ground_truth`, else its alias `label`, as text; None when neither holds a value."""
    for name in ("ground_truth", "label"):
        value = fields.get(name)
        if value is None:
            continue
        text = value if isinstance(value, str) else str(value)
        if text.strip():
            return text
    return None


def parse_metadata(
    value: Any, limits: DatasetLimits = DEFAULT_LIMITS
) -> tuple[dict[str, Any] | None, str | None]:
    """The metadata object of a row, or why it is not a usable one."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None, "must be a non-empty JSON object (it is empty or null)"
    if isinstance(value, str):
        try:
            value = loads_strict(value)
        except ValueError as error:
            return None, f"invalid JSON: {error}"
        except RecursionError:
            return None, f"invalid JSON: {limits.too_deep_to_read}"
    if not isinstance(value, dict):
        return None, f"must be a JSON object, got {_json_kind(value) or type(value).__name__}"
    if not value:
        return None, "must be a non-empty JSON object, got {}"
    return value, None


def _json_kind(value: Any) -> str | None:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"  # int and float are one JSON type
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return None


def _json_types(value: Any, path: str = "$") -> Iterator[tuple[str, str, str | None]]:
    """(key path, JSON type, problem) for every value below `value`, depth first."""
    items: Iterator[tuple[str, Any]]
    if isinstance(value, dict):
        if not value and path != "$":
            yield path, "object", "empty nested object"
            return
        items = ((f"{path}.{key}", child) for key, child in value.items())
    else:
        items = ((f"{path}[]", child) for child in value)
    for child_path, child in items:
        kind = _json_kind(child)
        if kind is None:
            yield child_path, "", f"value of type {type(child).__name__} is not JSON"
        elif kind == "number" and isinstance(child, int) and not INT64_MIN <= child <= INT64_MAX:
            yield child_path, kind, "integer outside the signed 64-bit range"
        elif kind == "number" and isinstance(child, float) and not math.isfinite(child):
            yield child_path, kind, "non-finite number (NaN/Infinity is not JSON)"
        elif kind != "null":  # null stands in for "absent" (Parquet structs fill gaps with it)
            yield child_path, kind, None
            if kind in ("object", "array"):
                yield from _json_types(child, child_path)
