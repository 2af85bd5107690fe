"""The bridge with a record of calls, over real HTTP in front of the scripted model (issue 28,
part 2): every answer is appended under its attempt key; `use` answers a repeated call from
the record; `replay` answers only from it, a miss 404 `cache_miss` that reaches no provider;
secrets never enter the record."""

from __future__ import annotations

import json
from pathlib import Path

from osmosis.eval.model.bridge_record import RECORD_FILE, CallRecorder
from osmosis.eval.results.redact import Redactor
from osmosis.testing import FakeModelServer
from tests.integration.test_bridge import QUESTION, SECRET_KEY, bridged, post


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_calls_are_recorded_then_replayed_without_the_provider(tmp_path: Path) -> None:
    first = tmp_path / "first" / RECORD_FILE
    redactor = Redactor(["s3cret-value"])
    async with FakeModelServer() as fake:
        recorder = CallRecorder(first, mode="off", redactor=redactor, model="openai/gpt-4o-mini")
        async with bridged(fake, recorder=recorder) as bridge:
            recorder.assign("r1", row=3, run=1)
            asked = [*QUESTION, {"role": "user", "content": "the key is s3cret-value"}]
            answers = []
            for messages in (QUESTION, asked):
                response = await post(bridge, {"messages": messages, "temperature": 0.5})
                assert response.status_code == 200
                answers.append(response.json())
        assert len(fake.requests) == 2
    record = _lines(first)
    assert [line["key"] for line in record] == [
        {"row": 3, "run": 1, "call": 0},
        {"row": 3, "run": 1, "call": 1},
    ]
    assert record[0]["request"] == {
        "messages": QUESTION,
        "model": "openai/gpt-4o-mini",
        "temperature": 0.5,
    }
    text = first.read_text()
    assert "s3cret-value" not in text and SECRET_KEY not in text
    assert "[REDACTED]" in text

    # Replayed with the provider gone: the same answers, none forwarded, no tokens counted.
    async with FakeModelServer() as gone:
        pass
    second = tmp_path / "second" / RECORD_FILE
    recorder = CallRecorder(
        second, mode="replay", sources=[first], redactor=redactor, model="openai/gpt-4o-mini"
    )
    async with bridged(gone, recorder=recorder) as bridge:
        recorder.assign("r9", row=3, run=1)  # a fresh rollout id for the same attempt
        replayed = await post(bridge, {"messages": QUESTION, "temperature": 0.5}, rollout_id="r9")
        assert replayed.status_code == 200
        assert replayed.json()["choices"] == answers[0]["choices"]
        # Same attempt, but the request changed: a miss, answered without the provider.
        changed = [{"role": "user", "content": "What is 17 * 24?"}]
        missed = await post(bridge, {"messages": changed, "temperature": 0.5}, rollout_id="r9")
        assert missed.status_code == 404
        error = missed.json()["error"]
        assert error["code"] == "cache_miss"
        assert "row 3, run 1, call 1 differs from the recorded one" in error["message"]
        # Another attempt of the same row has nothing recorded.
        recorder.assign("r10", row=3, run=2)
        other = await post(bridge, {"messages": QUESTION, "temperature": 0.5}, rollout_id="r10")
        assert other.status_code == 404
        assert "holds no call for row 3, run 2, call 0" in other.json()["error"]["message"]
        calls = bridge.take_calls("r9")
        assert [call.status_code for call in calls] == [200, 404]
        assert calls[0].total_tokens == 0 and calls[0].attempts == 0
        assert bridge.spent().calls == 0
    assert recorder.hits == 1 and recorder.misses == 2
    assert [line["source"] for line in _lines(second)] == ["record"]


async def test_use_answers_a_recorded_call_and_forwards_the_rest(tmp_path: Path) -> None:
    path = tmp_path / RECORD_FILE
    async with FakeModelServer() as fake:
        recorder = CallRecorder(path, mode="use", model="openai/gpt-4o-mini")
        async with bridged(fake, recorder=recorder) as bridge:
            recorder.assign("a", row=0, run=0)
            assert (await post(bridge, {"messages": QUESTION}, rollout_id="a")).status_code == 200
            recorder.assign("b", row=0, run=1)  # another attempt: not answered from run 0's
            assert (await post(bridge, {"messages": QUESTION}, rollout_id="b")).status_code == 200
            recorder.assign("c", row=0, run=0)  # run 0 again (a requeue): from the record
            assert (await post(bridge, {"messages": QUESTION}, rollout_id="c")).status_code == 200
            streamed = await post(
                bridge, {"messages": QUESTION, "stream": True}, rollout_id="unassigned"
            )
            assert streamed.status_code == 200  # no attempt known: forwarded, not recorded
        assert len(fake.requests) == 3
    assert [line["source"] for line in _lines(path)] == ["provider", "provider", "record"]
