"""What the record of model calls (`model_calls.jsonl`) costs per attempt: whole lines, as it
was written before deltas, beside the delta form, in the same run.

    .venv/bin/python bench/records.py [--attempts N] [--turn-bytes B] [--scratch DIR]

An agent of k turns sends its whole conversation on every call: call i carries the task and i
turns of `--turn-bytes` each (its answer and a tool result). N such attempts are recorded at
once, their calls interleaved as concurrent attempts make them, for agents of 1, 10 and 50
turns. Per attempt: the bytes written, the time `CallRecorder.write` takes for its calls (the
request is normalised and digested beforehand, the same for both forms), and the time reading
the record back takes: whole lines by the reader as it was before deltas (lines parsed, the
answers indexed), deltas by `CallRecorder`'s (`read_record`: requests rebuilt whole, answers
indexed); and, for compatibility, the current reader over the whole-line file.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, bench/ comes first on sys.path, and bench/platform.py would shadow the
# standard library's `platform` (which uuid imports).
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]
# ruff: noqa: E402

import argparse
import json
import tempfile
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from functools import partial
from typing import Any, Literal

from osmosis.eval.model.bridge_record import AttemptKey, CallRecorder, read_record

MODEL = "openai/gpt-4o-mini"


class WholeLines(CallRecorder):
    """The recorder's `write` as it was before deltas: every request whole."""

    def write(
        self,
        key: AttemptKey,
        normalised: Mapping[str, Any],
        digest: str,
        response: Mapping[str, Any],
        *,
        source: Literal["provider", "record"] = "provider",
    ) -> None:
        assert self.path is not None
        redacted = json.loads(json.dumps(response, default=str))
        if self._file is None:
            self._file = self.path.open("a", encoding="utf-8")
        entry = {
            "v": 1,
            "key": key.as_dict(),
            "digest": digest,
            "request": normalised,
            "response": redacted,
            "source": source,
            "at": datetime.now(UTC).isoformat(),
        }
        self._file.write(json.dumps(entry, ensure_ascii=False, separators=(",", ":")) + "\n")
        self.written += 1


def read_whole_lines(path: Path) -> int:
    """The reader as it was before deltas: every line parsed, its answer indexed."""
    answers: dict[AttemptKey, dict[str, Any]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        key = AttemptKey(**{k: int(entry["key"][k]) for k in ("row", "run", "call")})
        answers.setdefault(key, {})[entry["digest"]] = entry["response"]
    return len(answers)


def _response(text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "model": "gpt-4o-mini",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 50, "total_tokens": 1050},
    }


def _calls(
    recorder: CallRecorder, attempts: int, turns: int, turn_bytes: int
) -> list[tuple[AttemptKey, dict[str, Any], str, dict[str, Any]]]:
    """Every call of `attempts` agents of `turns` turns, interleaved, prepared for `write`."""
    half = turn_bytes // 2
    prepared = []
    conversations = {
        run: [
            {"role": "system", "content": "You are an agent with a shell."},
            {"role": "user", "content": f"task {run}"},
        ]
        for run in range(attempts)
    }
    for call in range(turns):
        for run, messages in conversations.items():
            normalised, digest = recorder.prepare({"messages": messages, "temperature": 0.7})
            answer = f"step {call} of {run}: " + "a" * half
            prepared.append((AttemptKey(0, run, call), normalised, digest, _response(answer)))
            messages += [
                {"role": "assistant", "content": answer},
                {"role": "tool", "tool_call_id": f"c{call}", "content": "o" * half},
            ]
    return prepared


def _write(recorder: CallRecorder, calls: list[Any]) -> float:
    began = time.perf_counter()
    for key, normalised, digest, response in calls:
        recorder.write(key, normalised, digest, response)
    recorder.close()
    return time.perf_counter() - began


def _replay(path: Path) -> CallRecorder:
    """The record read as `--cache replay` reads it."""
    return CallRecorder(None, mode="replay", sources=[path], model=MODEL)


def _timed(read: Callable[[], object]) -> float:
    began = time.perf_counter()
    read()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=20)
    parser.add_argument("--turn-bytes", type=int, default=2000)
    parser.add_argument("--scratch", type=Path, default=None)
    args = parser.parse_args()
    print(f"{args.attempts} attempts at once, {args.turn_bytes} bytes a turn; per attempt:")
    print(
        f"{'turns':>5} {'form':<6} {'bytes':>11} {'write ms':>9} {'read ms':>8}"
        f" {'bytes ratio':>11} {'write ratio':>11} {'read ratio':>10}"
    )
    with tempfile.TemporaryDirectory(dir=args.scratch) as scratch:
        for turns in (1, 10, 50):
            whole_path = Path(scratch) / f"whole-{turns}.jsonl"
            delta_path = Path(scratch) / f"delta-{turns}.jsonl"
            whole = WholeLines(whole_path, model=MODEL)
            delta = CallRecorder(delta_path, model=MODEL)
            calls = _calls(delta, args.attempts, turns, args.turn_bytes)
            # Alternated, twice each, the faster kept: the machine is shared.
            write_whole = write_delta = read_whole = read_delta = read_compat = float("inf")
            for _ in range(2):
                whole_path.unlink(missing_ok=True)
                delta_path.unlink(missing_ok=True)
                write_whole = min(write_whole, _write(whole, calls))
                write_delta = min(write_delta, _write(delta, calls))
                read_whole = min(read_whole, _timed(partial(read_whole_lines, whole_path)))
                read_delta = min(read_delta, _timed(partial(_replay, delta_path)))
                read_compat = min(read_compat, _timed(partial(_replay, whole_path)))
            rebuilt = [c.request for c in read_record(delta_path)]
            assert rebuilt == [c.request for c in read_record(whole_path)]  # the same calls
            n = args.attempts
            whole_bytes, delta_bytes = whole_path.stat().st_size, delta_path.stat().st_size
            print(
                f"{turns:>5} {'whole':<6} {whole_bytes / n:>11,.0f} {write_whole / n * 1e3:>9.2f}"
                f" {read_whole / n * 1e3:>8.2f}"
            )
            print(
                f"{turns:>5} {'delta':<6} {delta_bytes / n:>11,.0f} {write_delta / n * 1e3:>9.2f}"
                f" {read_delta / n * 1e3:>8.2f} {delta_bytes / whole_bytes:>11.3f}"
                f" {write_delta / write_whole:>11.2f} {read_delta / read_whole:>10.2f}"
            )
            print(
                f"{turns:>5} {'compat':<6} {'':>11} {'':>9} {read_compat / n * 1e3:>8.2f}"
                f" {'':>11} {'':>11} {read_compat / read_whole:>10.2f}"
                "  (whole lines, current reader)"
            )


if __name__ == "__main__":
    main()
