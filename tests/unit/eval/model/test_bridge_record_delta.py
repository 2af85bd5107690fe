"""Records that do not grow quadratically (issue 28, part 2): a call whose conversation extends
its attempt's previous one is written as a delta, any other whole; `read_record` rebuilds every
request exactly, with the digest it was recorded under; a record written before deltas reads
as before; a crash's torn last line neither breaks reading nor a resumed run's appends."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from osmosis.eval.model.bridge_record import (
    AttemptKey,
    CallRecorder,
    RecordError,
    read_record,
    request_digest,
)

MODEL = "openai/gpt-4o-mini"
SYSTEM = {"role": "system", "content": "You are a careful agent."}


def _answer(text: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}


def _write(recorder: CallRecorder, key: AttemptKey, messages: list[dict[str, Any]]) -> str:
    prepared = recorder.prepare({"messages": messages, "temperature": 0.5})
    recorder.write(key, prepared, _answer(f"answer {key.describe()}"))
    return prepared.digest


def _agent(turns: int, tag: str, size: int = 1000) -> list[list[dict[str, Any]]]:
    """The conversations an agent of `turns` calls sends: each call appends the answer and a
    tool result of about `size` characters to the previous one."""
    conversation = [SYSTEM, {"role": "user", "content": f"task {tag}"}]
    calls = []
    for turn in range(turns):
        calls.append(list(conversation))
        result = f"result {tag} {turn}. " * (size // len(f"result {tag} {turn}. "))
        conversation += [
            {"role": "assistant", "content": f"answer {tag} {turn}"},
            {"role": "tool", "tool_call_id": f"c{turn}", "content": result},
        ]
    return calls


def _whole_bytes(path: Path) -> int:
    """What the same calls take written whole, as before deltas."""
    total = 0
    for call in read_record(path):
        entry = {
            "v": 1,
            "key": call.key.as_dict(),
            "digest": call.digest,
            "request": call.request,
            "response": call.response,
            "source": call.source,
            "at": call.at,
        }
        total += len(json.dumps(entry, ensure_ascii=False, separators=(",", ":"))) + 1
    return total


def test_interleaved_ten_turn_attempts_are_deltas_and_read_back_whole(tmp_path: Path) -> None:
    path = tmp_path / "model_calls.jsonl"
    recorder = CallRecorder(path, model=MODEL)
    one, two = _agent(10, "a"), _agent(10, "b")
    written: dict[AttemptKey, str] = {}
    for call, (first, second) in enumerate(zip(one, two, strict=True)):
        written[AttemptKey(0, 0, call)] = _write(recorder, AttemptKey(0, 0, call), first)
        written[AttemptKey(0, 1, call)] = _write(recorder, AttemptKey(0, 1, call), second)
    recorder.close()

    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["v"] for line in lines] == [1, 1] + [2] * 18  # each attempt's first whole
    assert lines[2]["delta"]["shared"] == 2 and len(lines[2]["delta"]["messages"]) == 2
    assert "messages" not in lines[2]["request"]

    calls = list(read_record(path))
    assert {call.key: call.digest for call in calls} == written
    for call in calls:
        conversation = (one if call.key.run == 0 else two)[call.key.call]
        assert call.request == {"messages": conversation, "model": MODEL, "temperature": 0.5}
        assert request_digest(call.request) == call.digest  # the digest of the whole request
    # 10 calls, ~1 KB added per turn: whole lines hold 45 tool results per attempt, deltas 9.
    assert path.stat().st_size <= _whole_bytes(path) / 3

    reader = CallRecorder(None, mode="replay", sources=[path], model=MODEL)
    digest = reader.prepare({"messages": one[9], "temperature": 0.5}).digest
    assert reader.lookup(AttemptKey(0, 0, 9), digest) == _answer("answer row 0, run 0, call 9")


def test_a_rewritten_history_is_written_whole_and_every_call_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "model_calls.jsonl"
    recorder = CallRecorder(path, model=MODEL)
    task = {"role": "user", "content": "task"}
    first = [SYSTEM, task]
    second = [*first, {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u2"}]
    summary = [SYSTEM, {"role": "user", "content": "summary of u2: the agent compacted it"}]
    after = [*summary, {"role": "assistant", "content": "a3"}]
    edited = [SYSTEM, {"role": "user", "content": "task, edited"}, *after[2:], task]
    shorter = [SYSTEM]
    conversations = [first, second, summary, after, edited, shorter, [*shorter, task]]
    digests = [_write(recorder, AttemptKey(1, 0, i), c) for i, c in enumerate(conversations)]
    recorder.close()

    forms = [json.loads(line)["v"] for line in path.read_text().splitlines()]
    assert forms == [1, 2, 1, 2, 1, 1, 2]  # rewritten, edited and shortened: whole
    calls = list(read_record(path))
    assert [call.request["messages"] for call in calls] == conversations
    assert [call.digest for call in calls] == digests
    assert all(request_digest(call.request) == call.digest for call in calls)


def test_a_requeue_a_reopened_file_and_a_resumed_run_start_attempts_whole(
    tmp_path: Path,
) -> None:
    path = tmp_path / "model_calls.jsonl"
    calls = _agent(4, "r", size=60)
    recorder = CallRecorder(path, model=MODEL)
    recorder.assign("first", row=2, run=0)
    for conversation in calls[:2]:
        key = recorder.next_key("first")
        assert key is not None
        _write(recorder, key, conversation)
    recorder.forget("first")  # given up: its attempt goes again under a fresh rollout id
    recorder.assign("again", row=2, run=0)
    for conversation in calls[:3]:
        key = recorder.next_key("again")
        assert key is not None
        _write(recorder, key, conversation)
    recorder.close()  # a halt: what follows may not build on what is in the file
    _write(recorder, AttemptKey(2, 0, 3), calls[3])
    recorder.close()
    resumed = CallRecorder(path, model=MODEL)  # another process appends to the same file
    _write(resumed, AttemptKey(2, 0, 1), calls[1])
    resumed.close()

    forms = [json.loads(line)["v"] for line in path.read_text().splitlines()]
    assert forms == [1, 2, 1, 2, 2, 1, 1]
    rebuilt = [call.request["messages"] for call in read_record(path)]
    assert rebuilt == [calls[0], calls[1], *calls, calls[1]]


# Written by the recorder as it was before deltas (every line whole), verbatim: the digests
# pin what a request's digest is, which deltas must not change.
BEFORE_DELTAS = """\
{"v":1,"key":{"row":4,"run":1,"call":0},"digest":"sha256:786274ebabc3dfea539a3671c820e856a46d2293e8ecd44e436b26bbd9a0be8f","request":{"messages":[{"content":"You multiply.","role":"system"},{"content":"What is 17 * 23?","role":"user"}],"model":"openai/gpt-4o-mini","temperature":0.5},"response":{"id":"chatcmpl-0","choices":[{"index":0,"message":{"role":"assistant","content":"step 0"},"finish_reason":"stop"}]},"source":"provider","at":"2026-12-05T06:31:47.131996+00:00"}
{"v":1,"key":{"row":4,"run":1,"call":1},"digest":"sha256:47307d01482aeea3107ed0b3e3395339b7d55bacf1e6e97c6f701e04ec8fe3de","request":{"messages":[{"content":"You multiply.","role":"system"},{"content":"What is 17 * 23?","role":"user"},{"content":"step 0","role":"assistant"},{"content":"go on 0","role":"user"}],"model":"openai/gpt-4o-mini","temperature":0.5},"response":{"id":"chatcmpl-1","choices":[{"index":0,"message":{"role":"assistant","content":"step 1"},"finish_reason":"stop"}]},"source":"provider","at":"2026-12-05T06:31:47.132094+00:00"}
{"v":1,"key":{"row":4,"run":1,"call":2},"digest":"sha256:409db835415cf458c69b8b4fa4a5a299a941ab87a5ea641dfa102da0701ead21","request":{"messages":[{"content":"You multiply.","role":"system"},{"content":"What is 17 * 23?","role":"user"},{"content":"step 0","role":"assistant"},{"content":"go on 0","role":"user"},{"content":"step 1","role":"assistant"},{"content":"go on 1","role":"user"}],"model":"openai/gpt-4o-mini","temperature":0.5},"response":{"id":"chatcmpl-2","choices":[{"index":0,"message":{"role":"assistant","content":"step 2"},"finish_reason":"stop"}]},"source":"provider","at":"2026-12-05T06:31:47.132181+00:00"}
"""  # noqa: E501


def test_a_record_written_before_deltas_answers_the_same_requests(tmp_path: Path) -> None:
    path = tmp_path / "model_calls.jsonl"
    path.write_text(BEFORE_DELTAS)
    reader = CallRecorder(None, mode="replay", sources=[path], model=MODEL)
    conversation = [
        {"role": "system", "content": "You multiply."},
        {"role": "user", "content": "What is 17 * 23?"},
    ]
    for call in range(3):
        digest = reader.prepare({"temperature": 0.5, "messages": conversation}).digest
        answer = reader.lookup(AttemptKey(4, 1, call), digest)
        assert isinstance(answer, dict), answer
        assert answer["choices"][0]["message"]["content"] == f"step {call}"
        conversation = [
            *conversation,
            {"role": "assistant", "content": f"step {call}"},
            {"role": "user", "content": f"go on {call}"},
        ]
    assert reader.hits == 3 and reader.misses == 0
    assert [len(call.request["messages"]) for call in read_record(path)] == [2, 4, 6]


def test_a_torn_last_line_is_skipped_and_cut_off_before_a_resume_appends(tmp_path: Path) -> None:
    path = tmp_path / "model_calls.jsonl"
    calls = _agent(3, "t", size=60)
    recorder = CallRecorder(path, model=MODEL)
    for call, conversation in enumerate(calls[:2]):
        _write(recorder, AttemptKey(0, 0, call), conversation)
    recorder.close()
    torn = path.read_text().splitlines(keepends=True)
    path.write_text(torn[0] + torn[1][: len(torn[1]) // 2])  # the crash cut the delta short
    assert [call.key for call in read_record(path)] == [AttemptKey(0, 0, 0)]

    resumed = CallRecorder(path, model=MODEL)
    for call, conversation in enumerate(calls):
        _write(resumed, AttemptKey(0, 1, call), conversation)
    resumed.close()
    lines = path.read_text().splitlines()
    assert len(lines) == 4 and lines[0] == torn[0].rstrip("\n")
    rebuilt = [(call.key.run, call.request["messages"]) for call in read_record(path)]
    assert rebuilt == [(0, calls[0]), *((1, c) for c in calls)]


def test_a_delta_whose_base_is_gone_is_named(tmp_path: Path) -> None:
    path = tmp_path / "model_calls.jsonl"
    recorder = CallRecorder(path, model=MODEL)
    for call, conversation in enumerate(_agent(3, "g", size=60)):
        _write(recorder, AttemptKey(5, 2, call), conversation)
    _write(recorder, AttemptKey(6, 0, 0), [SYSTEM])
    recorder.close()
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + lines[2] + lines[3])  # the line call 2 builds on is missing
    with pytest.raises(RecordError) as raised:
        CallRecorder(None, mode="replay", sources=[path], model=MODEL)
    assert str(raised.value).startswith(f"{path}:2 is not a model call record line: delta.base")
    assert "for row 5, run 2" in str(raised.value)


def test_a_message_with_unicode_line_separators_reads_back(tmp_path: Path) -> None:
    # Written raw (ensure_ascii=False): a reader splitting on every Unicode line break would
    # cut the line in two, as the reader before deltas did.
    path = tmp_path / "model_calls.jsonl"
    recorder = CallRecorder(path, model=MODEL)
    first = [{"role": "user", "content": "a\u2028paragraph\u2029and a\x85next line"}]
    second = [*first, {"role": "assistant", "content": "ok\u2028"}]
    digests = [_write(recorder, AttemptKey(0, 0, i), c) for i, c in enumerate([first, second])]
    recorder.close()
    calls = list(read_record(path))
    assert [call.request["messages"] for call in calls] == [first, second]
    assert [call.digest for call in calls] == digests
