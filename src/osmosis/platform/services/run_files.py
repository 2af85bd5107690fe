"""A platform run's directory as the API reads it: downloadable files and log entries.

The worker hosts the engine exactly as `osmosis eval run` does, so `<home>/runs/<id>/` is an
ordinary local run directory. Only the download layout is served:

    metrics.json   summary.jsonl   logs.txt
    trajectories/row_<r>_run_<k>.json      artifacts/row_<r>_run_<k>/<path>

    manifest = file_manifest(run_dir, types=["metrics"], rows=None)
    page = read_logs(run_dir / "logs.txt", cursor=None, limit=50)

A rollout wrote the artifacts, so nothing here follows a symbolic link: a link anywhere on a
path (or a name too long for the file system) makes that path a 404, never the link's target.
"""

from __future__ import annotations

import functools
import os
import re
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from osmosis.eval.inputs.dataset_formats import sha256_file
from osmosis.platform.core.errors import NotFound, ValidationFailed
from osmosis.private_file import open_private_append
from osmosis.wire.runs import (
    DEFAULT_FILE_TYPES,
    FILE_TYPES,
    FileManifest,
    FileTotals,
    FileType,
    RunFile,
    RunLogEntry,
    TypeTotals,
)

LOG_FILE = "logs.txt"
PLATFORM_PREFIX = "[platform] "
_ROLLOUT_PREFIX = "[rollout] "
_ROW_TOKEN = re.compile(r"^(\d{1,12})(?:\s*-\s*(\d{1,12}))?$")
_SLOT = re.compile(r"^row_(\d+)_run_(\d+)$")
_TRAJECTORY = re.compile(r"^row_(\d+)_run_(\d+)\.json$")
_TIMESTAMPED = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:[+-]\d\d:\d\d|Z)?) (.*)$")
_LEVEL = re.compile(r"^(error|warning): ", re.IGNORECASE)
# Engine lines that mean something went wrong without ending the run.
_ENGINE_WARNINGS = (
    "halting dispatch",
    "run incomplete",
    "interrupted",
    "rollout endpoint",
    "restarting rollout server",
    "model provider outage",
    "warning: ",
)
_CHUNK = 1 << 16


# -- files --------------------------------------------------------------------------------------
def parse_types(text: str | None) -> tuple[FileType, ...]:
    """`metrics,trajectories` → the types; `all` alone means every type."""
    if text is None or not text.strip():
        return DEFAULT_FILE_TYPES
    words = [word.strip() for word in text.split(",") if word.strip()]
    if words == ["all"]:
        return FILE_TYPES
    unknown = [word for word in words if word not in (*FILE_TYPES, "all")]
    problems = [f"unknown file type(s) {', '.join(unknown)}"] if unknown else []
    if "all" in words and len(words) > 1:
        problems.append("all cannot be combined with other types")
    if problems:
        raise ValidationFailed(
            f"{'; '.join(problems)}: use {', '.join(FILE_TYPES)}, or all alone",
            details={"types": text, "valid": [*FILE_TYPES, "all"]},
        )
    return tuple(word for word in FILE_TYPES if word in words)


@dataclass(frozen=True)
class RowSpans:
    """Rows `3,7,10-20` as inclusive spans: a huge range costs nothing to hold or test."""

    spans: tuple[tuple[int, int], ...]

    def __contains__(self, row: object) -> bool:
        return isinstance(row, int) and any(start <= row <= end for start, end in self.spans)


def parse_rows(text: str | None) -> RowSpans | None:
    if text is None or not text.strip():
        return None
    spans, problems = [], []
    for token in (part.strip() for part in text.split(",")):
        found = _ROW_TOKEN.match(token)
        if found is None:
            problems.append(f"{token!r} is not a row like 3 or a range like 10-20")
            continue
        start, end = int(found.group(1)), int(found.group(2) or found.group(1))
        if end < start:
            problems.append(f"range {token!r} must be ascending")
        spans.append((start, end))
    if problems:
        raise ValidationFailed(
            f"rows {text!r}: " + "; ".join(problems), details={"rows": text, "problems": problems}
        )
    return RowSpans(tuple(spans))


def file_type(path: str) -> FileType | None:
    """The type of a layout path, or None when it is not one the layout allows."""
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts) or "\\" in path:
        return None
    if path == "metrics.json":
        return "metrics"
    if path == LOG_FILE:
        return "logs"
    if path == "summary.jsonl" or (len(parts) == 2 and parts[0] == "trajectories"):
        return "trajectories" if path == "summary.jsonl" or _TRAJECTORY.match(parts[1]) else None
    if len(parts) >= 3 and parts[0] == "artifacts" and _SLOT.match(parts[1]):
        # The reference reserves each attempt's top-level manifest.json.
        return None if len(parts) == 3 and parts[2] == "manifest.json" else "artifacts"
    return None


def _row_of(path: str) -> int | None:
    parts = path.split("/")
    if len(parts) >= 2 and parts[0] in ("trajectories", "artifacts"):
        found = _SLOT.match(parts[1].removesuffix(".json"))
        return int(found.group(1)) if found else None
    return None


def _layout_files(run_dir: Path, types: Sequence[FileType], rows: RowSpans | None) -> Iterator[str]:
    """Candidate layout paths of the chosen types. Only the folders those types (and rows)
    need are listed: a run of 10,000 attempts has as many trajectories and artifact
    folders, and `eval info` asks for metrics.json alone."""
    wanted = {
        "metrics.json": "metrics",
        "summary.jsonl": "trajectories",
        LOG_FILE: "logs",
    }
    for name, kind in wanted.items():
        if kind in types and (run_dir / name).is_file() and not (run_dir / name).is_symlink():
            yield name
    for folder in ("trajectories", "artifacts"):
        root = run_dir / folder
        if folder not in types or not root.is_dir() or root.is_symlink():
            continue
        with os.scandir(root) as listing:
            entries = sorted(listing, key=lambda entry: entry.name)
        for entry in entries:
            row = _row_of(f"{folder}/{entry.name}")
            if rows is not None and row is not None and row not in rows:
                continue
            if entry.is_symlink():
                continue
            if entry.is_file():
                yield f"{folder}/{entry.name}"
            elif entry.is_dir():
                yield from _files_under(entry.path, f"{folder}/{entry.name}")


def _files_under(directory: str, prefix: str) -> Iterator[str]:
    """Regular files below `directory` as `prefix/...` paths, sorted; symlinks are skipped."""
    with os.scandir(directory) as listing:
        entries = sorted(listing, key=lambda entry: entry.name)
    for entry in entries:
        if entry.is_symlink():
            continue
        if entry.is_file():
            yield f"{prefix}/{entry.name}"
        elif entry.is_dir():
            yield from _files_under(entry.path, f"{prefix}/{entry.name}")


def file_manifest(
    run_dir: Path, *, types: Sequence[FileType], rows: RowSpans | None
) -> FileManifest:
    """Every downloadable file of the chosen types; `rows` keeps those rows' trajectories and
    artifacts (every attempt of each row)."""
    files: list[RunFile] = []
    by_type = {kind: TypeTotals(files=0, bytes=0) for kind in types}
    for path in _layout_files(run_dir, types, rows):
        kind = file_type(path)
        if kind is None or kind not in types:
            continue
        row = _row_of(path)
        if rows is not None and row is not None and row not in rows:
            continue
        full = run_dir / path
        try:
            info = full.lstat()
        except OSError:
            continue  # gone since it was listed
        if not stat.S_ISREG(info.st_mode):
            continue
        size = info.st_size
        sha256 = _sha256(str(full), size, info.st_mtime_ns, info.st_ino)
        files.append(RunFile(path=path, size=size, sha256=sha256, type=kind))
        totals = by_type[kind]
        by_type[kind] = TypeTotals(files=totals.files + 1, bytes=totals.bytes + size)
    return FileManifest(
        files=files,
        totals=FileTotals(
            files=len(files), bytes=sum(f.size for f in files), by_type=dict(by_type)
        ),
    )


def layout_file(run_dir: Path, path: str) -> Path:
    """The file at layout path `path`; anything else, or absent, is `NotFound`."""
    full = regular_file_within(run_dir, path.split("/")) if file_type(path) else None
    if full is None:
        shown = path if len(path) <= 200 else path[:200] + "..."
        raise NotFound(f"no file {shown!r} in this run", details={"path": shown})
    return full


def regular_file_within(base: Path, parts: Sequence[str]) -> Path | None:
    """`base/parts...` when every step is a real directory (no link) and the last a regular
    file; None otherwise, including a name too long for the file system (ENAMETOOLONG).

        regular_file_within(run_dir, ["artifacts", "row_0_run_0", "out.txt"])
    """
    if not parts or any(part in ("", ".", "..") or "/" in part for part in parts):
        return None
    path = base
    try:
        if not stat.S_ISDIR(base.lstat().st_mode):
            return None
        for index, part in enumerate(parts):
            path = path / part
            mode = path.lstat().st_mode
            wanted = stat.S_ISREG if index == len(parts) - 1 else stat.S_ISDIR
            if not wanted(mode):
                return None
    except (OSError, ValueError):  # missing, too long, or a NUL in the name
        return None
    return path


@functools.lru_cache(maxsize=100_000)
def _sha256(path: str, size: int, mtime_ns: int, inode: int) -> str:
    """The file's SHA-256, remembered per (path, size, mtime, inode): a manifest of a large run
    would otherwise read every trajectory again on each `eval info` or download. A file that
    changes (run outputs are replaced by rename) changes its key."""
    return sha256_file(path)


# -- logs ---------------------------------------------------------------------------------------
def append_log(run_dir: Path, message: str, *, level: str = "info") -> None:
    """Add a platform line to the run's `logs.txt` (the engine writes its own lines there)."""
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    stamp = datetime.now(UTC).isoformat(timespec="milliseconds")
    marker = "" if level == "info" else f"{level}: "
    lines = message.rstrip("\n").replace("\n", "\n  ")
    with open(open_private_append(run_dir / LOG_FILE), "a", encoding="utf-8") as handle:
        handle.write(f"{stamp} {PLATFORM_PREFIX}{marker}{lines}\n")


@dataclass(frozen=True)
class LogPage:
    entries: list[RunLogEntry]
    next_cursor: str | None
    # Where the next read starts even at the end (`next_cursor` None): what `--follow` polls.
    end_cursor: str = "0"


def read_logs(path: Path, *, cursor: str | None, limit: int) -> LogPage:
    """Up to `limit` entries from byte offset `cursor`, oldest first; `next_cursor` is None
    when nothing more is written yet. A line without a timestamp continues the entry before
    it, so a multi-line message stays one entry."""
    position = _offset(cursor)
    entries: list[RunLogEntry] = []
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return LogPage(entries=[], next_cursor=None, end_cursor=str(position))
    with handle:
        position = min(position, handle.seek(0, 2))
        handle.seek(position)
        pending: list[str] = []
        while True:
            raw = handle.readline()
            if not raw.endswith(b"\n"):
                break  # end of file, or a line still being written: read it next time
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if _TIMESTAMPED.match(line) and pending:
                entries.append(_entry(pending))
                pending = []
                if len(entries) == limit:
                    return LogPage(
                        entries=entries, next_cursor=str(position), end_cursor=str(position)
                    )
            pending.append(line)
            position += len(raw)
    if pending:
        entries.append(_entry(pending))
    return LogPage(entries=entries, next_cursor=None, end_cursor=str(position))


def tail_logs(path: Path, *, count: int) -> list[RunLogEntry]:
    """The last `count` entries (for the detail view), reading only the end of the file."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return []
    start = max(0, size - 64 * 1024)
    with path.open("rb") as handle:
        handle.seek(start)
        text = handle.read().decode("utf-8", "replace")
    lines = text.splitlines()
    if start:
        lines = lines[1:]  # the first line was cut by the seek
    entries: list[list[str]] = []
    for line in lines:
        if _TIMESTAMPED.match(line) or not entries:
            entries.append([line])
        else:
            entries[-1].append(line)
    return [_entry(lines) for lines in entries[-count:]]


def _offset(cursor: str | None) -> int:
    if cursor is None or cursor == "":
        return 0
    if not re.fullmatch(r"[0-9]{1,18}", cursor):
        raise ValidationFailed(
            "cursor must be a next_cursor value from an earlier page", details={"cursor": cursor}
        )
    return int(cursor)


# The rollout's own output: Python logging ("ERROR:root:...", uvicorn's "ERROR:    ...") and
# tracebacks say how bad a line is; everything else it prints is info.
_ROLLOUT_ERROR = re.compile(r"(?:(?:ERROR|CRITICAL|FATAL)\b|Traceback \(most recent call last\))")
_ROLLOUT_WARNING = re.compile(r"WARN(?:ING)?\b")


def _rollout_level(message: str) -> str:
    if _ROLLOUT_ERROR.match(message):
        return "error"
    return "warning" if _ROLLOUT_WARNING.match(message) else "info"


def _entry(lines: list[str]) -> RunLogEntry:
    found = _TIMESTAMPED.match(lines[0])
    timestamp: datetime | None = None
    message = lines[0]
    if found:
        try:
            timestamp = datetime.fromisoformat(found.group(1))
        except ValueError:
            timestamp = None
        message = found.group(2)
    message = "\n".join([message, *lines[1:]])
    step, level = "engine", "info"
    if message.startswith(_ROLLOUT_PREFIX):
        step, message = "rollout", message.removeprefix(_ROLLOUT_PREFIX)
        level = _rollout_level(message)
    elif message.startswith(PLATFORM_PREFIX):
        step, message = "platform", message.removeprefix(PLATFORM_PREFIX)
        marked = _LEVEL.match(message)
        if marked:
            level, message = marked.group(1).lower(), message[marked.end() :]
    elif message.startswith(_ENGINE_WARNINGS):
        level = "warning"
    return RunLogEntry(timestamp=timestamp, level=level, step=step, message=message)
