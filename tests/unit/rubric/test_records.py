"""Reading rubric records: candidates, optional context, labels, and malformed lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from osmosis.rubric.records import RecordError, parse_record, read_records


@pytest.mark.parametrize(
    ("obj", "candidate"),
    [
        ({"solution_str": "42"}, "42"),
        ({"messages": [{"role": "assistant", "content": "plain"}]}, "plain"),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "text", "text": "a"},
                            {"type": "image_url"},
                            {"type": "text", "text": "b"},
                        ],
                    }
                ]
            },
            "a\nb",
        ),
        (
            # The last *non-empty* assistant message is judged; user and tool turns are not.
            {
                "messages": [
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "content": "first"},
                    {"role": "tool", "content": "result"},
                    {"role": "assistant", "content": "   "},
                    {"role": "user", "content": "thanks"},
                ]
            },
            "first",
        ),
    ],
)
def test_candidate_text(obj: dict, candidate: str) -> None:
    assert parse_record(obj, index=0, line=1).candidate == candidate


@pytest.mark.parametrize(
    ("obj", "label"),
    [
        ({"solution_str": "x", "id": "q1", "conversation_id": "c1"}, "q1"),
        ({"solution_str": "x", "conversation_id": "c1"}, "c1"),
        ({"solution_str": "x", "id": 7}, "7"),
        ({"solution_str": "x"}, "record[3]"),
    ],
)
def test_label(obj: dict, label: str) -> None:
    assert parse_record(obj, index=3, line=9).label == label


def test_optional_context() -> None:
    record = parse_record(
        {
            "solution_str": "x",
            "ground_truth": "y",
            "original_input": "q",
            "metadata": {"difficulty": "hard"},
        },
        index=0,
        line=1,
    )
    assert (record.ground_truth, record.original_input, record.metadata) == (
        "y",
        "q",
        {"difficulty": "hard"},
    )
    assert (
        parse_record({"solution_str": "x", "ground_truth": 4}, index=0, line=1).ground_truth == "4"
    )


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ([1, 2], "JSON object"),
        ({"id": "x"}, "neither 'messages' nor 'solution_str'"),
        ({"messages": "hi"}, "must be a list"),
        ({"messages": [{"role": "user", "content": "q"}]}, "no non-empty assistant"),
        ({"solution_str": 3}, "'solution_str' must be a string"),
        ({"solution_str": "x", "metadata": [1]}, "'metadata' must be an object"),
        ({"solution_str": "x", "ground_truth": {"a": 1}}, "'ground_truth' must be a string"),
    ],
)
def test_unusable_records(obj: object, message: str) -> None:
    with pytest.raises(RecordError, match=message):
        parse_record(obj, index=0, line=1)


def test_read_records_reports_bad_lines_with_numbers(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text(
        "\n".join(
            [
                json.dumps({"solution_str": "a"}),
                "{not json",
                "",
                json.dumps({"nothing": True}),
                json.dumps({"solution_str": "b"}),
            ]
        )
    )
    records = read_records(path)
    assert [(r.index, r.line, r.candidate) for r in records.items] == [(0, 1, "a"), (1, 5, "b")]
    assert [p.line for p in records.problems] == [2, 4]
    assert "not valid JSON" in records.problems[0].message
