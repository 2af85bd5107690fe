"""The samples index over a run directory's journal: what a live run's growing journal shows,
how search, order, row groups, neighbours and CSV behave, and what a query may ask."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from uuid import uuid4

import pytest

from osmosis.eval.inputs.dataset_formats import sha256_file
from osmosis.eval.results.records import AttemptRecord, journal_entry
from osmosis.platform.core.errors import ValidationFailed
from osmosis.platform.web.samples_index import (
    MAX_QUERY,
    TEXT_CHARS,
    DatasetFile,
    SampleIndex,
    SampleQuery,
    terms,
)
from osmosis.vocabulary import OUTCOMES


def record(row: int, k: int, status: str = "success", reward: float | None = 1.0, **extra):
    fields = {
        "row_index": row,
        "run_index": k,
        "rollout_id": uuid4().hex,
        "source_row_index": row + 10,  # rows came from further down the file
        "status": status,
        "reward": reward if status != "failed" else None,
        "duration_ms": 100.0 + row,
        "finished_at": datetime.now(UTC),
        **extra,
    }
    if status == "failed":
        fields.setdefault("error_type", "agent_error")
    return AttemptRecord(**fields)


def append(run_dir: Path, *records: AttemptRecord) -> None:
    text = "".join(json.dumps(journal_entry(r)) + "\n" for r in records)
    with (run_dir / "events.jsonl").open("a") as handle:
        handle.write(text)


def trajectory(run_dir: Path, row: int, k: int, answer: str, prompt: str = "a prompt") -> None:
    path = run_dir / "trajectories" / f"row_{row}_run_{k}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    steps = [
        {"step_id": 1, "source": "user", "message": prompt},
        {"step_id": 2, "source": "agent", "message": "thinking"},
        {"step_id": 3, "source": "agent", "message": answer},
        {"step_id": 4, "source": "agent", "message": ""},  # an empty last word is no output
    ]
    path.write_text(json.dumps({"steps": steps}))


def keys(samples) -> list[tuple[int, int]]:
    return [s.key for s in samples]


def test_a_growing_journal_is_read_a_line_at_a_time_and_the_latest_line_of_a_slot_wins(
    tmp_path: Path,
):
    index = SampleIndex(tmp_path, pass_threshold=1.0)
    assert len(index.refresh()) == 0  # no journal yet: a run that has just started
    append(tmp_path, record(0, 0))
    line = json.dumps(journal_entry(record(0, 1, "failed"))) + "\n"
    with (tmp_path / "events.jsonl").open("a") as handle:  # the engine is writing a line
        handle.write(line[:30])
    assert keys(index.refresh().samples) == [(0, 0)]  # a part of a line is not read
    with (tmp_path / "events.jsonl").open("a") as handle:
        handle.write(line[30:] + "{not json\n")  # its end, then a corrupt line
    append(tmp_path, record(1, 0, reward=0.5))
    index.refresh()
    assert keys(index.samples) == [(0, 0), (0, 1), (1, 0)]
    assert index.skipped_lines == 1  # left out, as a resume leaves it out
    append(tmp_path, record(0, 1, reward=1.0))  # --retry-failed records the slot again
    assert index.refresh().get(0, 1).status == "success"  # type: ignore[union-attr]
    assert len(index) == 3

    (tmp_path / "events.jsonl").rename(tmp_path / "old.jsonl")  # `--fresh` starts anew
    append(tmp_path, record(5, 0))
    assert keys(index.refresh().samples) == [(5, 0)]


def test_search_matches_every_word_or_phrase_in_input_output_or_error(tmp_path: Path):
    dataset = tmp_path / "rows.jsonl"
    rows = (json.dumps({"user_prompt": f"question {i}", "ground_truth": "x"}) for i in range(12))
    dataset.write_text("".join(row + "\n" for row in rows))
    append(
        tmp_path,
        record(0, 0),
        record(1, 0),
        record(2, 0, "failed", error_message="Boom: the Tool timed out"),
    )
    trajectory(tmp_path, 0, 0, "The answer is 42, said the otter")
    trajectory(tmp_path, 1, 0, "I would rather not", prompt="ignored: the dataset has it")
    index = SampleIndex(
        tmp_path, pass_threshold=1.0, dataset=DatasetFile(dataset, sha256_file(dataset))
    ).refresh()

    def found(text: str) -> list[tuple[int, int]]:
        return keys(index.query(SampleQuery(text=text)))

    assert found("OTTER") == [(0, 0)]  # any case
    assert found("said 42") == [(0, 0)]  # every word, in any order
    assert found('"said the otter"') == [(0, 0)]
    assert found('"the otter said"') == []  # a phrase is matched as written
    assert found("question 11") == [(1, 0)]  # the input: dataset row 11, as the journal says
    assert found("tool timed") == [(2, 0)]  # the error message
    assert found("agent_error") == [(2, 0)]  # and its type
    assert found("") == [(0, 0), (1, 0), (2, 0)]
    assert index.input_of(index.get(1, 0)).user == "question 11"  # type: ignore[arg-type,union-attr]
    assert index.get(0, 0).output == "The answer is 42, said the otter"  # type: ignore[union-attr]


def test_a_changed_dataset_file_is_not_read_and_the_trajectory_gives_the_input(tmp_path: Path):
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text(json.dumps({"user_prompt": "old"}) + "\n")
    append(tmp_path, record(0, 0))
    trajectory(tmp_path, 0, 0, "an answer", prompt="as the rollout saw it")
    index = SampleIndex(tmp_path, pass_threshold=1.0, dataset=DatasetFile(dataset, "0" * 64))
    row = index.refresh().input_of(index.get(0, 0))  # type: ignore[arg-type]
    assert row is not None and (row.user, row.source) == ("as the rollout saw it", "trajectory")
    assert index.input_problem == "the dataset file rows.jsonl changed since the run"


def test_texts_are_cut_and_a_formula_never_reaches_a_spreadsheet(tmp_path: Path):
    append(tmp_path, record(0, 0), record(1, 0))
    trajectory(tmp_path, 0, 0, "y" * (TEXT_CHARS + 50))
    trajectory(tmp_path, 1, 0, '=HYPERLINK("http://evil.example")')
    index = SampleIndex(tmp_path, pass_threshold=1.0).refresh()
    rows = list(index.csv_rows(SampleQuery()))
    assert rows[0][:3] == ["row_index", "run_index", "status"]
    output = rows[0].index("output")
    assert rows[1][output] == "y" * TEXT_CHARS + "…"
    assert rows[2][output] == '\'=HYPERLINK("http://evil.example")'


def test_order_is_the_databases_missing_values_last_then_row_and_attempt(tmp_path: Path):
    append(
        tmp_path,
        record(0, 0, reward=0.5),
        record(0, 1, "failed"),
        record(1, 0, reward=1.0),
        record(1, 1, reward=0.5),
        record(2, 0, "skipped", reward=None),
    )
    index = SampleIndex(tmp_path, pass_threshold=1.0).refresh()
    by = {sort: keys(index.query(SampleQuery(sort=sort))) for sort in ("reward", "-reward")}
    assert by["reward"] == [(0, 0), (1, 1), (1, 0), (0, 1), (2, 0)]
    assert by["-reward"] == [(1, 0), (0, 0), (1, 1), (0, 1), (2, 0)]
    assert keys(index.query(SampleQuery(sort="-row_index"))) == [
        (2, 0),
        (1, 0),
        (1, 1),
        (0, 0),
        (0, 1),
    ]
    assert keys(index.query(SampleQuery(min_reward=0.5, max_reward=0.9))) == [(0, 0), (1, 1)]
    assert keys(index.query(SampleQuery(status="failed"))) == [(0, 1)]


def test_rows_group_their_matching_attempts_with_pass_at_k_over_all_of_them(tmp_path: Path):
    # Row 0: 1 pass in 4 attempts -> pass@1 1/4, pass@2 1 - C(3,2)/C(4,2) = 1/2, pass@4 1.
    # Row 1: 2 attempts (one skipped, left out): pass@1 1, pass@2 undefined (too few).
    append(
        tmp_path,
        *(record(0, k, reward=1.0 if k == 2 else 0.0) for k in range(4)),
        record(1, 0),
        record(1, 1, "skipped", reward=None),
    )
    index = SampleIndex(tmp_path, pass_threshold=1.0).refresh()
    low = index.query(SampleQuery(max_reward=0.0))
    groups = index.groups(low)
    assert [g.row_index for g in groups] == [0]  # row 1 has no attempt at reward 0
    assert keys(groups[0].samples) == [(0, 0), (0, 1), (0, 3)]
    assert (groups[0].attempts, groups[0].passes) == (4, 1)
    assert groups[0].pass_at_k == [(1, 0.25), (2, pytest.approx(0.5)), (4, 1.0)]
    everything = index.groups(index.query(SampleQuery()))
    assert (everything[1].attempts, everything[1].pass_at_k) == (1, [(1, 1.0)])


def test_neighbours_are_the_attempts_around_one_in_the_list_a_query_makes(tmp_path: Path):
    append(tmp_path, record(0, 0), record(1, 0, "failed"), record(2, 0), record(3, 0, "failed"))
    index = SampleIndex(tmp_path, pass_threshold=1.0).refresh()
    failed = SampleQuery(status="failed")
    first = index.neighbours(failed, (1, 0))
    assert (first.previous, first.next.key, first.position, first.total) == (None, (3, 0), 1, 2)  # type: ignore[union-attr]
    last = index.neighbours(failed, (3, 0))
    assert (last.previous.key, last.next) == ((1, 0), None)  # type: ignore[union-attr]
    outside = index.neighbours(failed, (2, 0))  # not failed: not in that list
    assert (outside.position, outside.next.key) == (None, (1, 0))  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ({"text": "x" * (MAX_QUERY + 1)}, f"at most {MAX_QUERY} characters"),
        ({"text": " ".join("abcdefghi")}, "at most 8 words"),
        ({"sort": "colour"}, "sort must be one of"),
        ({"status": "lost"}, "status must be one of"),
    ],
)
def test_a_query_is_bounded(query, says):
    with pytest.raises(ValidationFailed, match=says):
        SampleQuery(**query)
    assert terms('a "b c"  d') == ["a", "b c", "d"]


def test_a_search_of_ten_thousand_attempts_reads_each_trajectory_once(tmp_path: Path):
    # The cost is the first search (every output read); later ones scan texts in memory.
    records = [record(i // 4, i % 4, reward=float(i % 2)) for i in range(10_000)]
    append(tmp_path, *records)
    for i in range(0, 10_000, 97):
        trajectory(tmp_path, i // 4, i % 4, f"needle {i}.")
    index = SampleIndex(tmp_path, pass_threshold=1.0).refresh()
    assert len(index.query(SampleQuery(text="needle"))) == len(range(0, 10_000, 97))
    for path in (tmp_path / "trajectories").iterdir():
        path.unlink()  # read once: the texts are held, not read again
    started = time.perf_counter()
    for _ in range(5):
        assert keys(index.query(SampleQuery(text='"needle 97."'))) == [(24, 1)]
    assert (time.perf_counter() - started) / 5 < 1.0  # generous: shared CI machines


def test_each_outcome_filters_and_the_csv_names_it(tmp_path: Path):
    append(
        tmp_path,
        record(0, 0, reward=0.5),  # passes at this run's threshold of 0.5
        record(1, 0, reward=0.0),  # a wrong answer: not passed, not an error
        record(2, 0, "failed"),
        record(3, 0, "skipped", reward=None),
        record(4, 0, reward=None),  # not graded: not passed
    )
    index = SampleIndex(tmp_path, pass_threshold=0.5).refresh()
    found = {name: keys(index.query(SampleQuery(outcome=name))) for name in OUTCOMES}
    assert found == {
        "passed": [(0, 0)],
        "not_passed": [(1, 0), (4, 0)],
        "errored": [(2, 0)],
        "skipped": [(3, 0)],
    }
    rows = list(index.csv_rows(SampleQuery()))
    column = rows[0].index("outcome")
    assert [row[column] for row in rows[1:]] == [
        "passed",
        "not_passed",
        "errored",
        "skipped",
        "not_passed",
    ]
    with pytest.raises(ValidationFailed, match="outcome must be one of"):
        SampleQuery(outcome="failed")
