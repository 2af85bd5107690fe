"""Reading a rollout's ATIF document for the sample page: whatever its shape, the page gets
a conversation (or a reason), never an exception, and never a page of many megabytes."""

from __future__ import annotations

import json
from pathlib import Path

from osmosis.platform.web.trajectory import MAX_TEXT, conversation, read_conversation
from tests.web.conftest import MALFORMED_TRAJECTORY
from tests.web.seed import tool_trajectory


def test_a_well_formed_document_reads_as_turns_with_call_metrics():
    convo = conversation(tool_trajectory(payload=""))
    assert [t.role for t in convo.turns] == ["system", "user", "assistant", "assistant"]
    call = convo.turns[2]
    assert call.tool_calls[0].name == "multiply" and call.results[0].content == "42"
    assert (call.metrics.prompt_tokens, call.metrics.latency_ms) == (21, 812.5)
    assert not convo.turns[0].metrics  # no numbers: nothing to show


def test_a_calls_latency_in_its_atif_metrics_extra_is_shown_as_beside_them():
    # The engine writes trajectories ATIF-conformant: the latency sits in `metrics.extra`.
    step = {"step_id": 1, "source": "agent", "message": "42",
            "metrics": {"prompt_tokens": 21, "extra": {"latency_ms": 812.5}}}  # fmt: skip
    call = conversation({"steps": [step]}).turns[0]
    assert (call.metrics.prompt_tokens, call.metrics.latency_ms) == (21, 812.5)


def test_wrong_types_anywhere_are_read_as_absent():
    convo = conversation(MALFORMED_TRAJECTORY)
    assert [t.step for t in convo.turns] == [1, 2, 3]  # "three" is no step number
    first = convo.turns[0]
    assert first.tool_calls == [] and not first.metrics
    assert [r.content for r in convo.turns[2].results] == ["null", "null"]
    assert convo.grader_metrics == {}


def test_long_texts_are_cut_and_say_by_how_much():
    convo = conversation({"steps": [{"source": "user", "message": "y" * (MAX_TEXT + 1234)}]})
    text = convo.turns[0].text
    assert text.startswith("y" * MAX_TEXT) and "1,234 more characters" in text


def test_unreadable_documents_give_a_reason_without_the_servers_path(tmp_path: Path):
    missing = read_conversation(tmp_path / "none.json")
    assert missing.problem == "no trajectory was recorded for this attempt"
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert "not valid JSON" in (read_conversation(broken).problem or "")
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    assert "nested too deeply" in (read_conversation(deep).problem or "")
    folder = tmp_path / "folder.json"
    folder.mkdir()
    assert str(tmp_path) not in json.dumps(read_conversation(folder).problem)
