"""A multi-turn agent through the bridge over real HTTP, recorded as deltas (issue 28, part 2):
replayed with the provider gone it gets every answer again from the record, 0 provider calls;
the record is a fraction of whole lines; a record written before deltas replays the same."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from osmosis.eval.model.bridge import ModelBridge
from osmosis.eval.model.bridge_record import RECORD_FILE, CallRecorder, read_record
from osmosis.eval.results.redact import Redactor
from osmosis.testing import FakeModelServer, Reply, Rule
from tests.integration.test_bridge import bridged, post
from tests.unit.eval.model.test_bridge_record_delta import BEFORE_DELTAS

MODEL = "openai/gpt-4o-mini"
TURNS = 10
SECRET = "s3cret-tool-token"


def _drawing_model() -> FakeModelServer:
    """Every answer unlike any other: only a record can give the same ones twice."""
    draws = itertools.count()
    return FakeModelServer(script=[Rule(respond=lambda _: Reply(f"draw {next(draws)}"))])


async def _agent(
    bridge: ModelBridge, rollout_id: str, task: str, *, rewrite_at: int | None = None
) -> list[dict[str, Any]]:
    """TURNS calls, each resending the conversation with the answer and a ~2 KB tool result
    appended; after call `rewrite_at` it rewrites its history (keeps the task, a summary)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent with a shell."},
        {"role": "user", "content": task},
    ]
    answers = []
    for turn in range(TURNS):
        response = await post(bridge, {"messages": messages}, rollout_id=rollout_id)
        assert response.status_code == 200, response.text
        answer = response.json()["choices"][0]["message"]
        answers.append(answer)
        if turn == rewrite_at:
            messages = [*messages[:2], {"role": "user", "content": f"summary of {turn} turns"}]
            continue
        output = f"$ step {turn} of {task}, token {SECRET}\n" + "ok " * 660
        messages = [*messages, answer, {"role": "user", "content": output}]
    return answers


def _size(line: dict[str, Any]) -> int:
    """The bytes of `line` written as the recorder writes it (a None field left out)."""
    line = {k: v for k, v in line.items() if v is not None}
    return len(json.dumps(line, ensure_ascii=False, separators=(",", ":"))) + 1


async def test_a_ten_turn_agent_is_replayed_from_a_record_of_deltas(tmp_path: Path) -> None:
    first = tmp_path / "first" / RECORD_FILE
    redactor = Redactor([SECRET])
    async with _drawing_model() as model:
        recorder = CallRecorder(first, mode="off", redactor=redactor, model=MODEL)
        async with bridged(model, recorder=recorder) as bridge:
            recorded = {}
            for run, rewrite_at in ((0, None), (1, 6)):
                recorder.assign(f"r{run}", row=0, run=run)
                recorded[run] = await _agent(
                    bridge, f"r{run}", "count the files", rewrite_at=rewrite_at
                )
        assert len(model.requests) == 2 * TURNS
    lines = [json.loads(line) for line in first.read_text().splitlines()]
    # Whole: each attempt's first call, and the one after run 1 rewrote its history.
    assert [line["key"]["call"] for line in lines if line["v"] == 1] == [0, 0, 7]
    assert SECRET not in first.read_text()
    # Run 0, ten turns of ~2 KB each: its lines are under a third of what whole lines take.
    written = sum(_size(line) for line in lines if line["key"]["run"] == 0)
    whole = sum(
        _size({**line, "v": 1, "request": call.request, "delta": None})
        for line, call in zip(lines, read_record(first), strict=True)
        if line["key"]["run"] == 0
    )
    assert written <= whole / 3, (written, whole)

    async with FakeModelServer() as gone:
        pass  # its port answers nothing: a call that reached it would fail
    second = tmp_path / "second" / RECORD_FILE
    recorder = CallRecorder(second, mode="replay", sources=[first], redactor=redactor, model=MODEL)
    async with bridged(gone, recorder=recorder) as bridge:
        for run in range(2):
            recorder.assign(f"again{run}", row=0, run=run)  # fresh rollout ids, same attempts
            again = await _agent(
                bridge, f"again{run}", "count the files", rewrite_at=6 if run else None
            )
            assert again == recorded[run]
        assert bridge.spent().calls == 0
    assert recorder.hits == 2 * TURNS and recorder.misses == 0
    # The replay's own record rebuilds to the same requests, so it can be replayed in turn.
    assert [(c.key, c.digest, c.request) for c in read_record(second)] == [
        (c.key, c.digest, c.request) for c in read_record(first)
    ]


async def test_a_record_written_before_deltas_is_replayed(tmp_path: Path) -> None:
    old = tmp_path / "old" / RECORD_FILE
    old.parent.mkdir()
    old.write_text(BEFORE_DELTAS)
    async with FakeModelServer() as gone:
        pass
    recorder = CallRecorder(tmp_path / RECORD_FILE, mode="replay", sources=[old], model=MODEL)
    async with bridged(gone, recorder=recorder) as bridge:
        recorder.assign("r", row=4, run=1)
        messages = [
            {"role": "system", "content": "You multiply."},
            {"role": "user", "content": "What is 17 * 23?"},
        ]
        for call in range(3):
            body = {"messages": messages, "temperature": 0.5}
            response = await post(bridge, body, rollout_id="r")
            assert response.status_code == 200, response.text
            assert response.json()["choices"][0]["message"]["content"] == f"step {call}"
            messages = [
                *messages,
                {"role": "assistant", "content": f"step {call}"},
                {"role": "user", "content": f"go on {call}"},
            ]
        assert bridge.spent().calls == 0
    assert recorder.hits == 3
