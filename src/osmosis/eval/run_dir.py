"""The local run directory: the journal that makes resume exact, and the files users read.

    .osmosis/evals/<name>/
      manifest.json   events.jsonl (journal)   logs.txt
      index.jsonl     summary.jsonl            progress.json    metrics.json
      rollout_trials/<rollout_id>/...          (written by the rollout server)
      trajectories/row_<r>_run_<k>.json        artifacts/row_<r>_run_<k>/...

Every finished attempt is appended to `events.jsonl` and fsynced before it counts; a resume
skips what the journal holds. Memory is one offset per attempt slot, never the records.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import uuid
from array import array
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from osmosis.eval.engine import FinishedAttempt
from osmosis.eval.records import AttemptRecord, index_row, journal_entry

_STATUSES = (None, "success", "failed", "skipped")
MANIFEST_SCHEMA_VERSION = 1
STATE_SCHEMA_VERSION = 1


class RunLocked(Exception):
    """Another process is running this run name right now."""


class ResumeRefused(Exception):
    """The run exists with different resolved inputs; resuming would mix two experiments."""

    def __init__(self, name: str, changed: list[str]) -> None:
        super().__init__(
            f"run '{name}' was created with different resolved inputs and cannot be resumed. "
            f"Changed: {', '.join(changed)}. Restart under the same name with --fresh, or "
            "choose another --name"
        )
        self.changed = changed


@dataclass(frozen=True)
class Slots:
    """Attempt slots: slot = row_index * n + run_index."""

    rows: int
    n: int

    @property
    def total(self) -> int:
        return self.rows * self.n

    def of(self, row_index: int, run_index: int) -> int:
        return row_index * self.n + run_index


class RunDirectory:
    """One local run: its lock, manifest, journal and output files."""

    def __init__(
        self,
        path: Path,
        *,
        slots: Slots,
        redact: Callable[[str], str] = lambda text: text,
    ) -> None:
        self.path = path
        self.name = path.name
        self.slots = slots
        self.redact = redact
        self._offsets = array("q", [-1]) * slots.total
        self._resumed = bytearray(slots.total)  # 1 = recorded by an earlier invocation
        self._status = bytearray(slots.total)  # index into _STATUSES; 0 = not recorded
        self._journal: IO[bytes] | None = None
        self._log: IO[str] | None = None
        self._lock: IO[str] | None = None
        self.manifest: dict[str, Any] = {}

    # -- opening --------------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        path: Path,
        *,
        slots: Slots,
        inputs: Mapping[str, Any],
        provenance: Mapping[str, Any],
        fresh: bool = False,
        redact: Callable[[str], str] = lambda text: text,
    ) -> RunDirectory:
        """Create the run, or resume it if its resolved inputs are unchanged."""
        run = cls(path, slots=slots, redact=redact)
        run._acquire_lock()
        try:
            if fresh and path.exists():
                stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
                path.rename(path.with_name(f"{path.name}.archive-{stamp}"))
            manifest_path = path / "manifest.json"
            if manifest_path.exists():
                run.manifest = json.loads(manifest_path.read_text())
                changed = _changed_inputs(run.manifest.get("inputs", {}), inputs)
                if changed:
                    raise ResumeRefused(path.name, changed)
            else:
                path.mkdir(parents=True, exist_ok=True)
                run.manifest = {
                    "schema_version": MANIFEST_SCHEMA_VERSION,
                    "local_run_id": uuid.uuid4().hex,
                    "run_name": path.name,
                    "created_at": _now(),
                    "inputs": dict(inputs),
                    "provenance": dict(provenance),
                }
                _write_json(manifest_path, run.manifest)
            run._load_journal()
            run._log = (path / "logs.txt").open("a", encoding="utf-8")
        except BaseException:
            run.close()
            raise
        return run

    def _acquire_lock(self) -> None:
        locks = self.path.parent / ".locks"
        locks.mkdir(parents=True, exist_ok=True)
        self._lock = (locks / f"{self.name}.lock").open("a+")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            self._lock = None
            raise RunLocked(f"run '{self.name}' is being run by another process") from None

    def _load_journal(self) -> None:
        journal = self.path / "events.jsonl"
        journal.touch()
        with journal.open("rb+") as handle:
            offset = 0
            for line in handle:
                if not line.endswith(b"\n"):
                    break  # a crash cut this line short: drop it, the attempt is pending
                with contextlib.suppress(ValueError):
                    record = AttemptRecord.model_validate_json(line)
                    slot = self._slot(record)
                    if slot is not None:
                        self._offsets[slot] = offset
                        self._resumed[slot] = 1
                        self._status[slot] = _STATUSES.index(record.status)
                offset += len(line)
            handle.truncate(offset)
        self._journal = journal.open("ab")

    def _slot(self, record: AttemptRecord) -> int | None:
        if record.row_index >= self.slots.rows or record.run_index >= self.slots.n:
            return None
        return self.slots.of(record.row_index, record.run_index)

    # -- what is done -------------------------------------------------------------------------
    def is_recorded(self, row_index: int, run_index: int) -> bool:
        return self._offsets[self.slots.of(row_index, run_index)] >= 0

    def status_of(self, row_index: int, run_index: int) -> str | None:
        """`success`, `failed`, `skipped`, or None when not recorded yet."""
        return _STATUSES[self._status[self.slots.of(row_index, run_index)]]

    def recorded_count(self) -> int:
        return sum(1 for offset in self._offsets if offset >= 0)

    def records(self) -> Iterator[AttemptRecord]:
        """Every recorded attempt in (row_index, run_index) order, read from the journal."""
        with (self.path / "events.jsonl").open("rb") as handle:
            for slot, offset in enumerate(self._offsets):
                if offset < 0:
                    continue
                handle.seek(offset)
                record = AttemptRecord.model_validate_json(handle.readline())
                if self._resumed[slot]:
                    record = record.model_copy(update={"resumed": True})
                yield record

    # -- ResultsSink ----------------------------------------------------------------------------
    def record(self, attempt: FinishedAttempt) -> None:
        """Store one attempt: its trajectory and artifacts first, then the journal line
        (fsynced). A crash in between leaves the attempt pending, never half-recorded."""
        record = attempt.record
        stem = f"row_{record.row_index}_run_{record.run_index}"
        if attempt.trajectory is not None:
            text = self.redact(json.dumps(attempt.trajectory, default=str))
            _write_text(self.path / "trajectories" / f"{stem}.json", text)
        if attempt.trial_dir is not None:
            self._scrub_trial(attempt.trial_dir)
        if attempt.trial_dir is not None and (attempt.trial_dir / "artifacts").is_dir():
            target = self.path / "artifacts" / stem
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(attempt.trial_dir / "artifacts", target)
        line = self.redact(json.dumps(journal_entry(record))).encode() + b"\n"
        assert self._journal is not None
        offset = self._journal.tell()
        self._journal.write(line)
        self._journal.flush()
        os.fsync(self._journal.fileno())
        slot = self._slot(record)
        if slot is not None:
            self._offsets[slot] = offset
            self._resumed[slot] = 0
            self._status[slot] = _STATUSES.index(record.status)

    def _scrub_trial(self, trial_dir: Path) -> None:
        # The rollout server wrote these itself, secrets and all: redact them in place.
        for name in ("trajectory.json", "diagnostics.json"):
            path = trial_dir / name
            with contextlib.suppress(OSError, UnicodeDecodeError):
                text = path.read_text(encoding="utf-8")
                redacted = self.redact(text)
                if redacted != text:
                    _write_text(path, redacted)

    def log(self, line: str) -> None:
        if self._log is None:
            return
        self._log.write(f"{_now()} {self.redact(line)}\n")
        self._log.flush()

    # -- outputs --------------------------------------------------------------------------------
    def write_outputs(
        self, *, status: str, summary: Mapping[str, Any], eval_run: Mapping[str, Any]
    ) -> None:
        """index.jsonl, summary.jsonl (a byte-identical copy), metrics.json, progress.json."""
        index_path = self.path / "index.jsonl"
        with _atomic(index_path) as handle:
            for record in self.records():
                handle.write(json.dumps(index_row(record)) + "\n")
        shutil.copyfile(index_path, self.path / "summary.jsonl")
        _write_json(
            self.path / "metrics.json",
            {"eval_run": {**eval_run, "status": status}, "summary": dict(summary)},
        )

    def write_progress(self, progress: Mapping[str, Any]) -> None:
        _write_json(self.path / "progress.json", dict(progress))

    def close(self) -> None:
        for handle in (self._journal, self._log, self._lock):
            if handle is not None:
                handle.close()
        self._journal = self._log = self._lock = None

    def __enter__(self) -> RunDirectory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _changed_inputs(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Dotted names of the inputs that differ, e.g. ['n', 'dataset.sha256']."""
    changed: list[str] = []
    for key in sorted(set(recorded) | set(current)):
        old, new = recorded.get(key), current.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            changed += [f"{key}.{sub}" for sub in _changed_inputs(old, new)]
        elif json.dumps(old, sort_keys=True) != json.dumps(new, sort_keys=True):
            changed.append(key)
    return changed


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@contextlib.contextmanager
def _atomic(path: Path) -> Iterator[IO[str]]:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        yield handle
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _write_text(path: Path, text: str) -> None:
    with _atomic(path) as handle:
        handle.write(text)


def _write_json(path: Path, payload: Mapping[str, Any]) -> None:
    _write_text(path, json.dumps(payload, indent=2, default=str) + "\n")
