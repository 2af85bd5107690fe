"""The record of model calls (issue 28, part 2): attempt keys, normalised requests and their
digests, reading a record back (a torn last line is dropped, a bad line named), and the
`[evaluation] cache` key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from osmosis.eval.inputs.config import ConfigError, parse_eval_config
from osmosis.eval.model.bridge_record import (
    AttemptKey,
    CallRecorder,
    Miss,
    RecordError,
    normalise,
    read_record,
    request_digest,
)
from osmosis.eval.results.redact import Redactor
from tests.unit.eval.inputs.test_config import with_evaluation

ANSWER = {"choices": [{"message": {"role": "assistant", "content": "391"}}]}


def test_the_call_sequence_counts_per_rollout_and_restarts_for_a_requeued_attempt() -> None:
    recorder = CallRecorder(None, mode="use")
    recorder.assign("a", row=2, run=1)
    assert [recorder.next_key("a") for _ in range(2)] == [AttemptKey(2, 1, 0), AttemptKey(2, 1, 1)]
    recorder.assign("b", row=2, run=1)  # the same attempt under a fresh rollout id
    assert recorder.next_key("b") == AttemptKey(2, 1, 0)
    recorder.forget("a")
    assert recorder.next_key("a") is None


def test_the_digest_ignores_key_order_and_names_the_run_model() -> None:
    one = normalise({"messages": [{"role": "user", "content": "hi"}], "top_p": 1}, model="m")
    two = normalise({"top_p": 1, "messages": [{"content": "hi", "role": "user"}]}, model="m")
    assert request_digest(one) == request_digest(two)
    other_model = normalise(
        {"messages": [{"role": "user", "content": "hi"}], "top_p": 1}, model="x"
    )
    assert request_digest(other_model) != request_digest(one)


def test_a_record_is_read_back_and_a_torn_last_line_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "model_calls.jsonl"
    writer = CallRecorder(path, model="m")
    prepared = writer.prepare({"messages": [{"role": "user", "content": "q"}]})
    writer.write(AttemptKey(0, 0, 0), prepared, ANSWER)
    digest = prepared.digest
    writer.close()
    with path.open("a") as handle:
        handle.write('{"v": 1, "key": {"row"')  # a crash mid-line
    reader = CallRecorder(None, mode="replay", sources=[path, tmp_path / "absent"], model="m")
    assert reader.answers == 1 and reader.read_from == [path]
    assert reader.lookup(AttemptKey(0, 0, 0), digest) == ANSWER
    assert isinstance(reader.lookup(AttemptKey(0, 1, 0), digest), Miss)
    assert reader.hits == 1 and reader.misses == 1


def test_lines_and_digests_are_those_of_the_entry_written_whole(tmp_path: Path) -> None:
    """The writer serialises a request once for its digest and its line, and splices the
    parts: each line must still be exactly `json.dumps` of its whole entry, and each digest
    that of the normalised, redacted request, secret or not, non-ASCII, delta or whole."""
    path = tmp_path / "model_calls.jsonl"
    redactor = Redactor(["s3cret-value"])
    writer = CallRecorder(path, model="openai/m", redactor=redactor)
    first = [{"role": "user", "content": 'héllo ✓ "quoted"\nline'}]
    second = [*first, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "é"}]
    leaked = [{"role": "user", "content": "the key is s3cret-value"}]
    requests = [
        (AttemptKey(0, 0, 0), {"messages": first, "temperature": 0.5, "stop": ["\u2028"]}),
        (AttemptKey(0, 0, 1), {"temperature": 0.5, "messages": second}),  # a delta
        (AttemptKey(1, 0, 0), {"messages": leaked, "top_p": 1}),  # redacted
    ]
    answer = {"choices": [{"message": {"role": "assistant", "content": "naïve s3cret-value"}}]}
    for key, request in requests:
        writer.write(key, writer.prepare(request), answer)
    writer.close()

    lines = path.read_text(encoding="utf-8").split("\n")[:-1]  # not splitlines: U+2028
    entries = [json.loads(line) for line in lines]
    assert [json.dumps(e, ensure_ascii=False, separators=(",", ":")) for e in entries] == lines
    assert [e["v"] for e in entries] == [1, 2, 1]
    assert "s3cret-value" not in path.read_text(encoding="utf-8")
    calls = list(read_record(path))
    for call, (_, request) in zip(calls, requests, strict=True):
        expected = redactor.redact_obj(normalise(request, model="openai/m"))
        assert call.request == expected
        assert call.digest == request_digest(expected)
        assert call.response == redactor.redact_obj(answer)


def test_a_line_that_is_not_a_record_is_named(tmp_path: Path) -> None:
    path = tmp_path / "model_calls.jsonl"
    path.write_text('not json\n{"v": 1}\n')
    with pytest.raises(RecordError, match=r"model_calls\.jsonl:1 is not a model call record"):
        CallRecorder(None, mode="use", sources=[path])


def test_off_reads_nothing(tmp_path: Path) -> None:
    path = tmp_path / "model_calls.jsonl"
    path.write_text("not json\n")
    assert CallRecorder(None, mode="off", sources=[path]).read_from == []


def test_the_cache_key_is_read_and_checked() -> None:
    assert parse_eval_config(with_evaluation("n = 1")).evaluation.cache == "off"
    assert parse_eval_config(with_evaluation('cache = "replay"')).evaluation.cache == "replay"
    with pytest.raises(ConfigError, match=r'evaluation.cache: must be "off", "use" or "replay"'):
        parse_eval_config(with_evaluation('cache = "always"'))
