"""Datasets: the format rules, rows as prompts, fingerprints, and row selection."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from osmosis.eval.inputs.dataset import (
    MAX_REPORTED_PROBLEMS,
    DatasetError,
    DatasetLimits,
    DatasetRow,
    RowSpecError,
    Selection,
    fingerprint_dataset,
    parse_row_spec,
    read_rows,
    select_rows,
    validate_dataset,
)

PROMPT_ROWS: list[dict[str, Any]] = [
    {"system_prompt": "You multiply.", "user_prompt": "3 x 4?", "ground_truth": "12"},
    {"system_prompt": "", "user_prompt": "2 x 5?", "ground_truth": "10"},
    {"system_prompt": "You multiply.", "user_prompt": 'say "hi", twice', "ground_truth": "hi hi"},
    {"system_prompt": "You multiply.", "user_prompt": "line one\nline two", "ground_truth": "2"},
    {"system_prompt": "You multiply.", "user_prompt": "7 x 6?", "ground_truth": "42"},
]


# -- writers --------------------------------------------------------------------------------------
def write_jsonl(path: Path, rows: list[Any]) -> Path:
    """Rows are dicts (dumped) or raw strings (written as they are)."""
    lines = [row if isinstance(row, str) else json.dumps(row) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_raw(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def write_csv(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def write_parquet(path: Path, columns: dict[str, Any]) -> Path:
    table = columns if isinstance(columns, pa.Table) else pa.table(columns)
    pq.write_table(table, path)
    return path


def prompt_csv(rows: list[dict[str, Any]]) -> str:
    import csv
    import io

    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def good(n: int = 4) -> list[dict[str, Any]]:
    return [{"user_prompt": f"q{i}", "ground_truth": f"a{i}"} for i in range(n)]


def meta(n: int = 4, **extra: Any) -> list[dict[str, Any]]:
    return [{"metadata": {"id": i, **extra}} for i in range(n)]


# -- every rule, by example -----------------------------------------------------------------------
Builder = Callable[[Path], Path]

MALFORMED_DATASETS: list[tuple[str, Builder, str]] = [
    (
        "unsupported extension",
        lambda d: write_csv(d / "x.txt", "user_prompt,ground_truth\n"),
        "x.txt: Unsupported file type '.txt'. Supported: csv, jsonl, parquet",
    ),
    ("empty file", lambda d: write_csv(d / "x.csv", ""), "x.csv: File is empty"),
    (
        "too few rows",
        lambda d: write_jsonl(d / "x.jsonl", good(2)),
        "x.jsonl: Dataset too small: 2 rows. A minimum of 4 rows is required.",
    ),
    (
        "jsonl invalid json",
        lambda d: write_jsonl(d / "x.jsonl", [*good(2), '{"user_prompt": "q"', *good(2)]),
        "x.jsonl:3: row 2: invalid JSON: Expecting ',' delimiter (column 20)",
    ),
    (
        "jsonl line not an object",
        lambda d: write_jsonl(d / "x.jsonl", [good(1)[0], "[1, 2]", *good(3)]),
        "x.jsonl:2: row 1: each line must be a JSON object, got list",
    ),
    (
        "jsonl key set differs",
        lambda d: write_jsonl(d / "x.jsonl", [*good(1), {"user_prompt": "q"}, *good(3)]),
        "x.jsonl:2: row 1: top-level fields differ from the first row (missing: ground_truth)",
    ),
    (
        "jsonl NaN is not JSON",
        lambda d: write_jsonl(
            d / "x.jsonl", [*good(3), '{"user_prompt": "q", "ground_truth": NaN}']
        ),
        "x.jsonl:4: row 3: invalid JSON: NaN is not valid JSON",
    ),
    (
        "prompt mode without ground truth column",
        lambda d: write_jsonl(d / "x.jsonl", [{"user_prompt": f"q{i}"} for i in range(4)]),
        "x.jsonl:1: Missing required columns: ground_truth (or label)",
    ),
    (
        "empty user prompt",
        lambda d: write_jsonl(
            d / "x.jsonl", [*good(2), {"user_prompt": " ", "ground_truth": "a"}, *good(1)]
        ),
        "x.jsonl:3: row 2: user_prompt: must be a non-empty string (got str ' ')",
    ),
    (
        "null ground truth",
        lambda d: write_jsonl(
            d / "x.jsonl", [*good(3), {"user_prompt": "q", "ground_truth": None}]
        ),
        "x.jsonl:4: row 3: ground_truth: needs a non-empty ground_truth (or label) value",
    ),
    (
        "system prompt not text",
        lambda d: write_jsonl(d / "x.jsonl", [{**row, "system_prompt": 3} for row in good(4)]),
        "x.jsonl:1: row 0: system_prompt: must be a string (got int 3)",
    ),
    (
        "csv wrong column count",
        lambda d: write_csv(d / "x.csv", "user_prompt,ground_truth\nq,a\nq,a,extra\nq,a\nq,a\n"),
        "x.csv:3: row 1: expected 2 columns, got 3",
    ),
    (
        "csv missing user prompt column",
        lambda d: write_csv(d / "x.csv", "question,ground_truth\n" + "q,a\n" * 4),
        "x.csv:1: Missing required columns: user_prompt.",
    ),
    ("csv no header", lambda d: write_csv(d / "x.csv", "\n\n"), "x.csv:1: File has no header row"),
    (
        "csv duplicate header",
        lambda d: write_csv(d / "x.csv", "user_prompt,user_prompt,ground_truth\n" + "q,q,a\n" * 4),
        "x.csv:1: duplicate column names in the header: user_prompt",
    ),
    (
        "csv not utf-8",
        lambda d: write_raw(d / "x.csv", b"user_prompt,ground_truth\nq,a\nq\xff,a\n"),
        "x.csv:3: not valid UTF-8",
    ),
    (
        "csv broken quote",
        lambda d: write_csv(d / "x.csv", 'user_prompt,ground_truth\nq,a\n"q"x,a\nq,a\nq,a\n'),
        "x.csv:3: malformed CSV",
    ),
    (
        "metadata empty object",
        lambda d: write_jsonl(d / "x.jsonl", [*meta(3), {"metadata": {}}]),
        "x.jsonl:4: row 3: metadata: must be a non-empty JSON object, got {}",
    ),
    (
        "metadata null",
        lambda d: write_jsonl(d / "x.jsonl", [{"metadata": None}, *meta(3)]),
        "x.jsonl:1: row 0: metadata: must be a non-empty JSON object (it is empty or null)",
    ),
    (
        "metadata blank csv cell",
        lambda d: write_csv(
            d / "x.csv", 'metadata\n"{""a"": 1}"\n""\n"{""a"": 2}"\n"{""a"": 3}"\n'
        ),
        "x.csv:3: row 1: metadata: must be a non-empty JSON object (it is empty or null)",
    ),
    (
        "metadata invalid json string",
        lambda d: write_csv(
            d / "x.csv", 'metadata\n"{""a"": 1}"\n{oops}\n"{""a"": 2}"\n"{""a"": 3}"\n'
        ),
        "x.csv:3: row 1: metadata: invalid JSON",
    ),
    (
        "metadata not an object",
        lambda d: write_jsonl(d / "x.jsonl", [*meta(3), {"metadata": "[1, 2]"}]),
        "x.jsonl:4: row 3: metadata: must be a JSON object, got array",
    ),
    (
        "metadata nested empty object",
        lambda d: write_jsonl(d / "x.jsonl", [*meta(3), {"metadata": {"id": 3, "a": {"b": {}}}}]),
        "x.jsonl:4: row 3: metadata: empty nested object at $.a.b",
    ),
    (
        "metadata integer beyond int64",
        lambda d: write_jsonl(d / "x.jsonl", [*meta(3), {"metadata": {"id": 2**63}}]),
        "x.jsonl:4: row 3: metadata: integer outside the signed 64-bit range at $.id",
    ),
    (
        "metadata type differs across rows",
        lambda d: write_jsonl(d / "x.jsonl", [*meta(2), {"metadata": {"id": "two"}}, *meta(1)]),
        "x.jsonl:3: row 2: metadata: value type at $.id is inconsistent across rows "
        "(number at line 1 vs string here)",
    ),
    (
        "parquet not parquet",
        lambda d: write_raw(d / "x.parquet", b"PAR1 not really"),
        "x.parquet: Invalid parquet file",
    ),
    (
        "parquet metadata column type",
        lambda d: write_parquet(d / "x.parquet", {"metadata": [1, 2, 3, 4]}),
        "x.parquet: metadata: must be a struct or a JSON string column, got int64",
    ),
    (
        "parquet null prompt",
        lambda d: write_parquet(
            d / "x.parquet", {"user_prompt": ["a", "b", None, "d"], "ground_truth": ["1"] * 4}
        ),
        "x.parquet: row 2: user_prompt: must be a non-empty string (missing)",
    ),
    (
        "parquet prompt column not text",
        lambda d: write_parquet(d / "x.parquet", {"user_prompt": [1, 2, 3, 4], "label": ["1"] * 4}),
        "x.parquet: user_prompt: must be a string column, got int64",
    ),
]


@pytest.mark.parametrize(
    ("build", "expected"),
    [pytest.param(build, expected, id=name) for name, build, expected in MALFORMED_DATASETS],
)
def test_malformed_dataset_names_the_problem(tmp_path: Path, build: Builder, expected: str) -> None:
    path = build(tmp_path)
    with pytest.raises(DatasetError) as caught:
        validate_dataset(path)
    assert expected.replace("x.", f"{tmp_path}/x.", 1) in str(caught.value)


def test_all_problems_are_counted_and_the_first_ones_listed(tmp_path: Path) -> None:
    rows = [*good(2), *({"user_prompt": "", "ground_truth": "a"} for _ in range(30))]
    path = write_jsonl(tmp_path / "many.jsonl", rows)

    with pytest.raises(DatasetError) as caught:
        validate_dataset(path)
    error = caught.value

    assert error.total == 30
    assert len(error.problems) == MAX_REPORTED_PROBLEMS
    assert [p.line for p in error.problems] == list(range(3, 3 + MAX_REPORTED_PROBLEMS))
    assert str(error).splitlines()[0] == f"Invalid dataset {path} (30 problems):"
    assert str(error).splitlines()[-1] == "  ... and 10 more"


def test_key_set_problem_is_not_blamed_twice(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "x.jsonl", [*good(3), {"user_prompt": "q"}])
    with pytest.raises(DatasetError) as caught:
        validate_dataset(path)
    assert caught.value.total == 1


# -- valid files and the rows they give -----------------------------------------------------------
def three_formats(directory: Path, rows: list[dict[str, Any]]) -> list[Path]:
    return [
        write_jsonl(directory / "d.jsonl", rows),
        write_csv(directory / "d.csv", prompt_csv(rows)),
        write_parquet(directory / "d.parquet", pa.Table.from_pylist(rows)),
    ]


def test_the_three_formats_give_the_same_rows(tmp_path: Path) -> None:
    expected = [
        DatasetRow(
            0,
            0,
            [{"role": "system", "content": "You multiply."}, {"role": "user", "content": "3 x 4?"}],
            "12",
            None,
        ),
        DatasetRow(1, 1, [{"role": "user", "content": "2 x 5?"}], "10", None),  # empty system
    ]
    for path in three_formats(tmp_path, PROMPT_ROWS):
        info = validate_dataset(path)
        assert (info.mode, info.rows, info.columns) == (
            "prompt",
            5,
            ("system_prompt", "user_prompt", "ground_truth"),
        ), path
        rows = list(read_rows(path))
        assert rows[:2] == expected, path
        assert rows[3].messages[1]["content"] == "line one\nline two", path  # quoted newline
        assert rows[2].messages[1]["content"] == 'say "hi", twice', path


def test_metadata_mode_reads_objects_strings_and_structs_alike(tmp_path: Path) -> None:
    objects = [{"metadata": {"a": i, "tags": ["x"], "deep": {"k": "v"}}} for i in range(4)]
    as_strings = [{"metadata": json.dumps(row["metadata"])} for row in objects]
    paths = [
        write_jsonl(tmp_path / "o.jsonl", objects),
        write_jsonl(tmp_path / "s.jsonl", as_strings),
        write_csv(tmp_path / "s.csv", prompt_csv(as_strings)),
        write_parquet(tmp_path / "struct.parquet", pa.Table.from_pylist(objects)),
        write_parquet(tmp_path / "string.parquet", pa.Table.from_pylist(as_strings)),
    ]
    for path in paths:
        assert validate_dataset(path).mode == "metadata", path
        rows = list(read_rows(path))
        assert [row.metadata for row in rows] == [row["metadata"] for row in objects], path
        assert all(row.messages == [] and row.label is None for row in rows), path


def test_labels_are_text_and_empty_labels_are_none(tmp_path: Path) -> None:
    rows = [
        {"user_prompt": "q", "ground_truth": 42, "metadata": {"i": 0}},
        {"user_prompt": "q", "ground_truth": 2.5, "metadata": {"i": 1}},
        {"user_prompt": "q", "ground_truth": "", "metadata": {"i": 2}},
        {"user_prompt": "q", "ground_truth": None, "metadata": {"i": 3}},
    ]
    path = write_jsonl(tmp_path / "labels.jsonl", rows)
    validate_dataset(path)
    assert [row.label for row in read_rows(path)] == ["42", "2.5", None, None]


def test_label_column_is_an_alias_for_ground_truth(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "alias.csv", "user_prompt,label\n" + "q,yes\n" * 4)
    assert validate_dataset(path).warnings == ()
    assert {row.label for row in read_rows(path)} == {"yes"}


def test_validation_summary_and_warnings(tmp_path: Path) -> None:
    text = "user_prompt,ground_truth,label,notes\n" + "q,a,b,n\n" * 4
    path = write_csv(tmp_path / "multiply.csv", "\ufeff" + text)  # a BOM, as Excel writes

    info = validate_dataset(path)

    assert info.name == "multiply" and info.format == "csv" and info.rows == 4
    assert info.columns == ("user_prompt", "ground_truth", "label", "notes")
    assert info.size == path.stat().st_size
    assert info.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert "columns ignored by eval: notes" in info.warnings
    assert any("ground_truth is used first" in w for w in info.warnings)


def test_blank_lines_are_not_rows(tmp_path: Path) -> None:
    path = tmp_path / "gaps.jsonl"
    path.write_text("\n" + "\n\n".join(json.dumps(r) for r in good(4)) + "\n\n", encoding="utf-8")
    assert validate_dataset(path).rows == 4
    assert [row.source_row_index for row in read_rows(path)] == [0, 1, 2, 3]


def test_fingerprint_matches_validation_in_every_format(tmp_path: Path) -> None:
    for path in three_formats(tmp_path, PROMPT_ROWS):
        fingerprint = fingerprint_dataset(path)
        info = validate_dataset(path)
        assert fingerprint.sha256 == info.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
        assert fingerprint.rows == info.rows == 5  # the CSV's quoted newline is one row
        assert fingerprint.size == path.stat().st_size


# -- selection ------------------------------------------------------------------------------------
def test_limit_takes_the_first_rows() -> None:
    assert select_rows(40, limit=3) == Selection((0, 1, 2), 40, "limit")
    assert select_rows(3, limit=10).rows == (0, 1, 2)


def test_sample_is_ten_percent_reproducible_from_its_seed() -> None:
    first = select_rows(1000)
    assert first.method == "sample" and first.seed is not None
    assert len(first.rows) == 100
    assert list(first.rows) == sorted(set(first.rows))
    assert select_rows(1000, seed=first.seed) == first
    assert select_rows(1000, seed=first.seed + 1).rows != first.rows
    assert len(select_rows(4, seed=1).rows) == 1  # at least one row
    assert len(select_rows(15, seed=1).rows) == 2  # rounded up


def test_rows_spec_overrides_limit_and_sampling() -> None:
    chosen = select_rows(30, limit=5, rows="3,7,10-12")
    assert chosen == Selection((3, 7, 10, 11, 12), 30, "rows")


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("0", (0,)),
        ("3,7,10-12", (3, 7, 10, 11, 12)),
        (" 12 , 2-3 ", (2, 3, 12)),
        ("5,1-6", tuple(range(1, 7))),
    ],
)
def test_row_spec_parses_offsets_and_ranges(spec: str, expected: tuple[int, ...]) -> None:
    assert parse_row_spec(spec, total_rows=20) == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "--rows is empty"),
        ("-3", "'-3': row offsets are non-negative integers"),
        ("20-10", "range '20-10' must be ascending (start <= end), e.g. '10-20'"),
        ("1,,2", "empty item"),
        ("a-b", "'a-b' is not an offset or a range like '10-20'"),
        ("3,25", "row 25 is out of range: the dataset has 20 rows (valid offsets are 0-19)"),
        ("18-22", "row 18-22 is out of range: the dataset has 20 rows"),
    ],
)
def test_bad_row_specs_say_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(RowSpecError) as caught:
        parse_row_spec(spec, total_rows=20)
    assert message in str(caught.value)


def test_every_row_spec_problem_is_listed() -> None:
    with pytest.raises(RowSpecError) as caught:
        select_rows(5, rows="9,x,4-2")
    message = str(caught.value)
    assert "'x' is not an offset" in message
    assert "'4-2' must be ascending" in message
    assert "row 9 is out of range: the dataset has 5 rows" in message


def test_selected_rows_are_renumbered_and_keep_their_source_index(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", good(10))
    rows = list(read_rows(path, select_rows(10, rows="7,2")))
    assert [(row.row_index, row.source_row_index) for row in rows] == [(0, 2), (1, 7)]
    assert [row.label for row in rows] == ["a2", "a7"]


def test_reading_a_selection_stops_after_the_last_selected_row(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [*good(3), "this line is not JSON"])
    assert [row.source_row_index for row in read_rows(path, select_rows(4, limit=2))] == [0, 1]
    with pytest.raises(DatasetError, match=r"d\.jsonl:4: row 3: invalid JSON"):
        list(read_rows(path, select_rows(4, rows="3")))


def test_a_selection_past_the_end_of_the_file_is_an_error(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", good(4))
    with pytest.raises(DatasetError, match="selected row 9 is past the end of the file"):
        list(read_rows(path, [1, 9]))


# -- odd input and bombs (issue 13.7) ----------------------------------------------------------
DEEP = '{"a": ' * 1000 + "1" + "}" * 1000  # a RecursionError for json, and for naive walks


def _deep_csv(d: Path) -> Path:
    cells = [json.dumps({"k": i}) for i in range(3)] + [DEEP]
    return write_csv(
        d / "x.csv", "metadata\n" + "".join(f'"{c.replace(chr(34), 2 * chr(34))}"\n' for c in cells)
    )


ODD_INPUT: list[tuple[str, Builder, str]] = [
    (
        "jsonl row nested 1000 deep",
        lambda d: write_jsonl(d / "x.jsonl", [*meta(3), '{"metadata": ' + DEEP + "}"]),
        "x.jsonl:4: row 3: invalid JSON: nested too deeply to read; a cell may nest at most 32",
    ),
    (
        "jsonl metadata string nested 1000 deep",
        lambda d: write_jsonl(d / "x.jsonl", [*meta(3), {"metadata": DEEP}]),
        "x.jsonl:4: row 3: metadata: invalid JSON: nested too deeply to read",
    ),
    ("csv metadata nested 1000 deep", _deep_csv, "x.csv:5: row 3: metadata: invalid JSON: nested"),
    (
        "metadata nested 40 deep (parses, but over the limit)",
        lambda d: write_jsonl(
            d / "x.jsonl", [*meta(3), '{"metadata": ' + '{"a": ' * 40 + "1" + "}" * 41]
        ),
        "x.jsonl:4: row 3: metadata: is nested more than 32 levels deep",
    ),
    (
        "jsonl NUL escape in a prompt",
        lambda d: write_jsonl(
            d / "x.jsonl", [*good(3), '{"user_prompt": "a\\u0000b", "ground_truth": "1"}']
        ),
        "x.jsonl:4: row 3: user_prompt: contains a NUL character (U+0000)",
    ),
    (
        "csv NUL byte in a cell",
        lambda d: write_raw(d / "x.csv", b"user_prompt,ground_truth\nq1,1\nq2,2\nq\x003,3\nq4,4\n"),
        "x.csv:4: row 2: user_prompt: contains a NUL character (U+0000)",
    ),
    (
        "jsonl lone surrogate",
        lambda d: write_jsonl(
            d / "x.jsonl", [*good(3), '{"user_prompt": "a\\ud800b", "ground_truth": "1"}']
        ),
        "x.jsonl:4: row 3: user_prompt: contains a lone surrogate (U+D800), which is not valid "
        "Unicode; fix the \\ud800 escape",
    ),
    (
        "lone surrogate inside metadata",
        lambda d: write_jsonl(d / "x.jsonl", [*meta(3), '{"metadata": {"k": ["\\udfff"]}}']),
        "x.jsonl:4: row 3: metadata: contains a lone surrogate (U+DFFF)",
    ),
    (
        "lone surrogate in a column name",
        lambda d: write_jsonl(
            d / "x.jsonl", ['{"user_prompt": "q", "ground_truth": "1", "\\ud800": 1}'] * 4
        ),
        "x.jsonl:1: row 0: \\ud800: the column name contains a lone surrogate",
    ),
]


@pytest.mark.parametrize(
    ("build", "expected"),
    [pytest.param(build, expected, id=name) for name, build, expected in ODD_INPUT],
)
def test_odd_input_is_a_validation_error_never_a_crash(
    tmp_path: Path, build: Builder, expected: str
) -> None:
    path = build(tmp_path)
    with pytest.raises(DatasetError) as caught:
        validate_dataset(path)
    assert expected.replace("x.", f"{tmp_path}/x.", 1) in str(caught.value)
    with pytest.raises(DatasetError):  # the engine's reader applies the same rules
        list(read_rows(path))


SMALL = DatasetLimits(max_cell_bytes=1000, max_rows=6, max_columns=5)


def test_a_cell_over_the_limit_is_refused_in_every_format(tmp_path: Path) -> None:
    rows = [*good(3), {"user_prompt": "é" * 501, "ground_truth": "1"}]  # 1,002 UTF-8 bytes
    frame = {key: [row[key] for row in rows] for key in rows[0]}
    paths = [
        write_jsonl(tmp_path / "x.jsonl", rows),
        write_csv(tmp_path / "x.csv", prompt_csv(rows)),
        write_parquet(tmp_path / "x.parquet", frame),
    ]
    for path in paths:
        with pytest.raises(DatasetError) as caught:
            validate_dataset(path, limits=SMALL)
        assert "row 3: user_prompt: holds more than 1,000 bytes" in str(caught.value), path
    exactly = [*good(3), {"user_prompt": "é" * 500, "ground_truth": "1"}]
    assert validate_dataset(write_jsonl(tmp_path / "ok.jsonl", exactly), limits=SMALL).rows == 4


def test_a_line_over_the_limit_is_never_held_and_reading_goes_on(tmp_path: Path) -> None:
    limits = DatasetLimits(max_cell_bytes=100)  # lines up to 400 bytes
    long_line = json.dumps({"user_prompt": "x" * 500, "ground_truth": "1"})
    path = write_jsonl(tmp_path / "x.jsonl", [*good(2), long_line, "not json", *good(2)])
    with pytest.raises(DatasetError) as caught:
        validate_dataset(path, limits=limits)
    assert [(p.line, p.message[:30]) for p in caught.value.problems] == [
        (3, "the line is longer than 400 by"),
        (4, "invalid JSON: Expecting value "),
    ]
    csv_path = write_csv(tmp_path / "x.csv", "user_prompt,ground_truth\n" + "x" * 500 + ",1\n")
    with pytest.raises(DatasetError, match=r"x\.csv:2: the line is longer than 400 bytes"):
        validate_dataset(csv_path, limits=limits)


def test_a_quoted_csv_cell_spanning_lines_is_bounded_too(tmp_path: Path) -> None:
    limits = DatasetLimits(max_cell_bytes=100)
    cell = '"' + "\n".join(["y" * 50] * 5) + '"'  # every line short, the cell 254 characters
    path = write_csv(tmp_path / "x.csv", f"user_prompt,ground_truth\n{cell},1\n")
    with pytest.raises(DatasetError, match="a cell holds more than 100 bytes"):
        validate_dataset(path, limits=limits)


def test_row_and_column_counts_are_bounded(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="more than 6 rows; a dataset may have at most"):
        validate_dataset(write_jsonl(tmp_path / "x.jsonl", good(7)), limits=SMALL)
    with pytest.raises(DatasetError, match="the file has 7 rows; a dataset may have at most 6"):
        validate_dataset(
            write_parquet(tmp_path / "x.parquet", {"user_prompt": ["q"] * 7, "label": ["1"] * 7}),
            limits=SMALL,
        )
    wide = ",".join(["user_prompt", "ground_truth", *(f"c{i}" for i in range(4))])
    with pytest.raises(DatasetError, match="the file has 6 columns; a dataset may have at most 5"):
        validate_dataset(write_csv(tmp_path / "w.csv", wide + "\n"), limits=SMALL)
    assert validate_dataset(write_jsonl(tmp_path / "y.jsonl", good(6)), limits=SMALL).rows == 6


def test_a_parquet_bomb_is_refused_from_its_footer(tmp_path: Path) -> None:
    # 4 rows of 50 KB strings in a file of about 1 KB: the average cell is over the limit,
    # so the file is refused before a page is decompressed.
    big = ["a" * 50_000 + str(i) for i in range(4)]
    path = tmp_path / "bomb.parquet"
    pq.write_table(
        pa.table({"user_prompt": big, "ground_truth": ["1"] * 4}), path, compression="zstd"
    )
    assert path.stat().st_size < 5_000
    limits = DatasetLimits(max_cell_bytes=10_000)
    with pytest.raises(DatasetError) as caught:
        validate_dataset(path, limits=limits)
    message = str(caught.value)
    assert re.search(
        r"column user_prompt holds [\d,]+ bytes per row on average in row group 0; "
        r"a cell may hold at most 10,000",
        message,
    ), message
    too_much = DatasetLimits(max_decompressed_bytes=100_000)
    with pytest.raises(DatasetError, match="decompress to 200,"):
        validate_dataset(path, limits=too_much)


def test_parquet_nesting_is_bounded_from_the_schema(tmp_path: Path) -> None:
    value: Any = {"leaf": 1}
    for _ in range(40):
        value = {"a": value}
    path = write_parquet(tmp_path / "x.parquet", pa.table({"metadata": [value] * 4}))
    with pytest.raises(DatasetError, match="column metadata is nested more than 32 levels deep"):
        validate_dataset(path)
