"""The bridge writes a provider's answer to the call record after sending it (issue 30): the
line waits `KEEP_AFTER_SEC`, out of the way of the answers arriving with it, and nothing of the
record is lost or reordered by the wait: lines come out in the order the answers came, deltas
chain as before, a close or flush in the meantime (a halt) writes what is queued first, and an
attempt forgotten meanwhile (given up, run again) starts whole again."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from osmosis.eval.model.bridge_record import (
    KEEP_AFTER_SEC,
    AttemptKey,
    CallRecorder,
    read_record,
)

MODEL = "openai/gpt-4o-mini"


def _answer(text: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}


def _conversation(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "task"}]
    for turn in range(turns):
        messages += [
            {"role": "assistant", "content": f"answer {turn}"},
            {"role": "user", "content": f"more {turn}"},
        ]
    return messages


def _queue(recorder: CallRecorder, rollout_id: str, turns: int, first: int = 0) -> list[str]:
    """Queue `turns` answered calls of one attempt, each extending the one before (the
    first: a conversation of `first` turns)."""
    digests = []
    for turn in range(first, first + turns):
        key = recorder.next_key(rollout_id)
        assert key is not None
        request = {"messages": _conversation(turn)}
        recorder.keep_soon(key, request, _answer(f"answer {turn}"))
        digests.append(recorder.prepare(request).digest)
    return digests


def test_queued_answers_are_written_a_moment_later_in_order_as_deltas(tmp_path: Path) -> None:
    path = tmp_path / "model_calls.jsonl"
    recorder = CallRecorder(path, model=MODEL)
    recorder.assign("r1", row=4, run=0)

    async def main() -> tuple[int, int, int]:
        _queue(recorder, "r1", 3)
        written_at_once = recorder.written
        await asyncio.sleep(0)
        next_turn = recorder.written
        await asyncio.sleep(KEEP_AFTER_SEC * 3)
        recorder.flush()  # the file's buffer: what the timer wrote is in it
        return written_at_once, next_turn, len(path.read_text().splitlines())

    # Nothing in the way of the answers going out, nor of the others arriving with them;
    # then every line, without a close.
    assert asyncio.run(main()) == (0, 0, 3)
    recorder.close()
    calls = list(read_record(path))
    assert [call.key for call in calls] == [AttemptKey(4, 0, n) for n in range(3)]
    assert [call.request["messages"] for call in calls] == [_conversation(n) for n in range(3)]
    lines = path.read_text().splitlines()
    assert ['"delta"' in line for line in lines] == [False, True, True]


def test_a_close_in_the_same_turn_writes_every_queued_answer(tmp_path: Path) -> None:
    path = tmp_path / "model_calls.jsonl"
    recorder = CallRecorder(path, model=MODEL)
    recorder.assign("r1", row=0, run=0)
    recorder.assign("r2", row=1, run=0)

    async def main() -> None:
        _queue(recorder, "r1", 2)
        _queue(recorder, "r2", 1)
        recorder.close()  # a halt: the loop may never turn again

    asyncio.run(main())
    keys = [call.key for call in read_record(path)]
    assert keys == [AttemptKey(0, 0, 0), AttemptKey(0, 0, 1), AttemptKey(1, 0, 0)]
    assert recorder.written == 3


def test_a_forgotten_attempt_keeps_its_queued_answer_and_starts_whole_again(
    tmp_path: Path,
) -> None:
    path = tmp_path / "model_calls.jsonl"
    recorder = CallRecorder(path, model=MODEL, mode="use")

    async def main() -> None:
        recorder.assign("r1", row=2, run=0)
        digest = _queue(recorder, "r1", 1)[0]
        recorder.forget("r1")  # given up in the same turn its answer came
        # Re-run under a fresh id: the answer is there to reuse, and its line is whole.
        recorder.assign("r2", row=2, run=0)
        assert recorder.lookup(recorder.next_key("r2"), digest) == _answer("answer 0")
        _queue(recorder, "r2", 2)
        await asyncio.sleep(0)

    asyncio.run(main())
    recorder.close()
    lines = path.read_text().splitlines()
    assert len(lines) == 3
    assert ['"delta"' in line for line in lines] == [False, False, True]


def test_an_attempt_forgotten_while_its_answers_wait_starts_whole_when_run_again(
    tmp_path: Path,
) -> None:
    path = tmp_path / "model_calls.jsonl"
    recorder = CallRecorder(path, model=MODEL)  # `off`: no lookup writes the queue early

    async def main() -> None:
        recorder.assign("r1", row=2, run=0)
        _queue(recorder, "r1", 2)
        recorder.forget("r1")  # given up before its lines are written
        recorder.assign("r2", row=2, run=0)  # the same attempt, run again
        _queue(recorder, "r2", 2, first=2)  # extending what r1 sent: still not a delta on it
        await asyncio.sleep(KEEP_AFTER_SEC * 3)

    asyncio.run(main())
    recorder.close()
    lines = path.read_text().splitlines()
    assert ['"delta"' in line for line in lines] == [False, True, False, True]
