"""A failed attempt's traceback, for its sample page.

    found = find_traceback(run_dir, rollout_id, convo.osmosis)
    found.text, found.source     # ("Traceback (most recent call last):\n...", "logs.txt")

The rollout result carries only the exception's message (`LocalBackend` sends `str(exc)` as
`err_message`, the journal and the trajectory keep that), while the traceback goes to the
rollout server's log, which the engine writes into the run's `logs.txt` as `[rollout]` lines.
So the traceback is looked for, in order, where the reference keeps backend diagnostics
(`rollout_trials/<rollout_id>/diagnostics.json`), in the trajectory's `extra.osmosis`, and
then in `logs.txt`: the rollout server's "... of rollout <id> failed" (or "rollout <id>
crashed") record and the traceback lines that follow it, and last in the attempt's own error
message, when a writer put the whole traceback there. Files are redacted by their writers.
"""

from __future__ import annotations

import json
import mmap
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from osmosis.platform.services.run_files import LOG_FILE, regular_file_within

MAX_LINES = 200
MAX_CHARS = 20_000
MAX_DIAGNOSTICS_BYTES = 1024 * 1024
_ROLLOUT_ID = re.compile(r"^[0-9a-f]{32}$")
_ROLLOUT_LINE = re.compile(rb"^\S+ \[rollout\] (.*)$")
# A new record of Python logging ("2026-12-01 19:20:10,534 ERROR name: ...") ends a traceback.
_LOG_RECORD = re.compile(rb"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ")
_TRACEBACK = b"Traceback (most recent call last):"
_KEYS = ("traceback", "err_traceback", "stack", "stacktrace")


@dataclass(frozen=True)
class FoundTraceback:
    text: str
    source: str  # "diagnostics.json", "trajectory", "logs.txt" or "error message"


def find_traceback(
    run_dir: Path,
    rollout_id: str,
    osmosis: Mapping[str, Any] | None,
    error_message: str | None = None,
) -> FoundTraceback | None:
    """The attempt's traceback from the first place that has one, or None; `osmosis` is
    the trajectory's `extra.osmosis` block, `error_message` the journal's."""
    if not _ROLLOUT_ID.fullmatch(rollout_id):
        return None
    # The rollout wrote rollout_trials/ itself: no link is followed on the way to the file.
    diagnostics = _read_json(
        regular_file_within(run_dir, ["rollout_trials", rollout_id, "diagnostics.json"])
    )
    for source, mapping in (
        ("diagnostics.json", diagnostics),
        ("trajectory", osmosis),
    ):
        text = _traceback_in(mapping)
        if text:
            return FoundTraceback(_clip(text), source)
    text = _from_log(run_dir / LOG_FILE, rollout_id)
    if text:
        return FoundTraceback(_clip(text), "logs.txt")
    start = (error_message or "").find(_TRACEBACK.decode())
    if start != -1 and error_message is not None:
        return FoundTraceback(_clip(error_message[start:]), "error message")
    return None


def _read_json(path: Path | None) -> Any:
    try:
        if path is None or path.stat().st_size > MAX_DIAGNOSTICS_BYTES:
            return None
        return json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError, RecursionError):
        return None


def _traceback_in(mapping: Any) -> str | None:
    if not isinstance(mapping, Mapping):
        return None
    for key in _KEYS:
        value = mapping.get(key)
        if isinstance(value, list) and all(isinstance(line, str) for line in value):
            value = "".join(value)  # traceback.format_exception's list of lines
        if isinstance(value, str) and value.strip():
            return value
    return None


def _from_log(path: Path, rollout_id: str) -> str | None:
    try:
        with (
            path.open("rb") as handle,
            mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data,
        ):
            return _scan(data, f"rollout {rollout_id} ".encode())
    except (OSError, ValueError):  # missing, or empty (mmap cannot map 0 bytes)
        return None


def _scan(data: mmap.mmap, needle: bytes) -> str | None:
    start = data.find(needle)
    while start != -1:
        line_start = data.rfind(b"\n", 0, start) + 1
        line_end = data.find(b"\n", start)
        line_end = len(data) if line_end == -1 else line_end
        header = data[line_start:line_end]
        if b"[rollout] " in header and (b" failed" in header or b" crashed" in header):
            block = _following(data, line_end + 1)
            if block:
                return block
        start = data.find(needle, line_end)
    return None


def _following(data: mmap.mmap, position: int) -> str | None:
    """The `[rollout]` lines after a failure record, up to the next log record."""
    lines: list[bytes] = []
    while position < len(data) and len(lines) < MAX_LINES:
        end = data.find(b"\n", position)
        end = len(data) if end == -1 else end
        found = _ROLLOUT_LINE.match(data[position:end])
        if found is None or _LOG_RECORD.match(found.group(1)):
            break
        lines.append(found.group(1))
        position = end + 1
    # A message of several lines comes first; the traceback starts at its own first line.
    first = next((i for i, line in enumerate(lines) if line.startswith(_TRACEBACK)), None)
    if first is None:
        return None
    return b"\n".join(lines[first:]).decode("utf-8", "replace")


def _clip(text: str) -> str:
    if len(text) <= MAX_CHARS:
        return text
    return f"{text[:MAX_CHARS]}\n… {len(text) - MAX_CHARS:,} more characters"
