"""The local run directory: the journal that makes resume exact, and the files users read.

    .osmosis/evals/<name>/
      manifest.json   events.jsonl (journal)   logs.txt
      index.jsonl     summary.jsonl            progress.json    metrics.json
      rollout_trials/<rollout_id>/...          (written by the rollout server; then, for the
                                               official `eval upload`, links to the two below,
                                               on a thread of their own: complete once the
                                               directory is closed, so after a crash the last
                                               attempts' may be missing; none on the platform,
                                               `official_trials=False`)
      trajectories/row_<r>_run_<k>.json        artifacts/row_<r>_run_<k>/...

Every finished attempt is appended to `events.jsonl` and fsynced before it counts; a resume
skips what the journal holds. Memory is one offset per attempt slot, never the records.

The engine stores attempts with `await store(attempt)`: the writing (redaction, trajectory,
artifacts, the journal line) happens on a writer thread, with group commit: one fsync of the
journal covers every record that arrived meanwhile, and `store` returns once that fsync did
(`osmosis.eval.host.group_commit`). The event loop never waits on the disk, so no journal write
stalls the model calls of the attempts in flight. A record's trajectory and artifacts are
written before its journal line, so a killed process never leaves a counted attempt without
them; only the journal is fsynced (what a resume trusts).

Redaction never touches the journal's structure: a record's free-text fields are redacted
before it is serialised (`redact_record`), and trajectories are redacted as data, string by
string, so a short secret such as `x` cannot turn `row_index` into `row_inde[REDACTED]`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import threading
import uuid
from array import array
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from osmosis.eval.errors import HostError
from osmosis.eval.host.batch_thread import BatchThread
from osmosis.eval.host.group_commit import GroupCommit
from osmosis.eval.results.official_layout import mirror_trial
from osmosis.eval.results.records import AttemptRecord, FinishedAttempt, index_row, journal_entry
from osmosis.eval.results.redact import Redactor
from osmosis.eval.results.trial_outputs import (
    DEFAULT_ARTIFACT_LIMITS,
    SKIPPED_NOTES,
    ArtifactCopy,
    ArtifactLimits,
    Skipped,
    copy_artifacts,
    read_trial_json,
    write_trial_json,
)
from osmosis.rollout.jsonbytes import dumps
from osmosis.rollout.trajectory import write_bytes_in_place
from osmosis.vocabulary import ATTEMPT_STATUSES, AttemptStatus

# A slot's status as one byte: 0 is not recorded yet, then each status by its place.
_STATUSES: tuple[AttemptStatus | None, ...] = (None, *ATTEMPT_STATUSES)
MANIFEST_SCHEMA_VERSION = 1
STATE_SCHEMA_VERSION = 1
# How long after an attempt is written its `rollout_trials/` entry is made (`BatchThread`).
MIRROR_AFTER_SEC = 0.05


class RunLocked(HostError):
    """Another process is running this run name right now."""

    code = "CONFLICT"
    default_hint = "wait for it to finish, or choose another --name"


class ResumeRefused(HostError):
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
        redactor: Redactor | None = None,
        artifact_limits: ArtifactLimits = DEFAULT_ARTIFACT_LIMITS,
        official_trials: bool = True,
    ) -> None:
        self.path = path
        self.official_trials = official_trials
        self.name = path.name
        self.slots = slots
        self.redactor = redactor or Redactor()
        self.redact: Callable[[str], str] = self.redactor.redact
        self.artifact_limits = artifact_limits
        self._offsets = array("q", [-1]) * slots.total
        self._resumed = bytearray(slots.total)  # 1 = recorded by an earlier invocation
        self._status = bytearray(slots.total)  # index into _STATUSES; 0 = not recorded
        self._journal: IO[bytes] | None = None
        self._log: IO[str] | None = None
        self._lock: IO[str] | None = None
        self.manifest: dict[str, Any] = {}
        # The writer thread and the event loop share the journal and the log.
        self._journal_lock = threading.Lock()
        self._log_lock = threading.Lock()
        self._writer: GroupCommit[FinishedAttempt, tuple[AttemptRecord, int]] = GroupCommit(
            write=self._write, commit=self._commit, name=f"journal-{self.name}"
        )
        # `rollout_trials/` in the official layout is filled off the commit path: its file
        # operations on the writer thread cost a third of the dispatch rate at 0 ms latency
        # (631 vs 995 attempts/s). Complete once the run directory is closed.
        self._mirrors = BatchThread(f"mirror-{self.name}", delay=MIRROR_AFTER_SEC)

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
        redactor: Redactor | None = None,
        artifact_limits: ArtifactLimits = DEFAULT_ARTIFACT_LIMITS,
        official_trials: bool = True,
    ) -> RunDirectory:
        """Create the run, or resume it if its resolved inputs are unchanged.
        `official_trials`: fill `rollout_trials/` for the official `eval upload` (the module
        doc); the platform's run directories go without."""
        run = cls(
            path,
            slots=slots,
            redactor=redactor,
            artifact_limits=artifact_limits,
            official_trials=official_trials,
        )
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

    def status_of(self, row_index: int, run_index: int) -> AttemptStatus | None:
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
    async def store(self, attempt: FinishedAttempt) -> None:
        """Store one attempt durably: written on the writer thread, returns once a journal
        fsync after its line returned (see the module doc)."""
        record, offset = await self._writer.submit(attempt)
        self._index(record, offset)

    def record(self, attempt: FinishedAttempt) -> None:
        """`store` on the calling thread, with an fsync of its own (for tools and tests)."""
        record, offset = self._write(attempt)
        self._commit()
        self._index(record, offset)
        if self.official_trials:
            self._mirrors.wait()  # its `rollout_trials/` entry too, before returning

    def _mirror(self, record: AttemptRecord, **files: Any) -> None:
        """Queue the attempt's `rollout_trials/<rollout_id>/` (`mirror_trial`) on the mirror
        thread (`BatchThread`: in the gap after a wave of attempts); a failure there is
        logged, never the attempt's."""

        def mirror() -> None:
            try:
                mirror_trial(self.path, record, **files)
            except OSError as error:
                self.log(f"rollout_trials/{record.rollout_id}: not filled ({error})")

        self._mirrors.submit(mirror)

    def _write(self, attempt: FinishedAttempt) -> tuple[AttemptRecord, int]:
        """Its trajectory and artifacts first, then its journal line (not yet fsynced): a crash
        in between leaves the attempt pending, never half-recorded. Returns the record as
        written and its journal offset."""
        record = redact_record(attempt.record, self.redact)
        stem = f"row_{record.row_index}_run_{record.run_index}"
        document = attempt.trajectory
        if document is not None:
            data = dumps(document, default=str)
            if not self.redactor.clean_json(data.decode()):  # a secret in it: redact it as data
                document = self.redactor.redact_obj(document)
                data = dumps(document, default=str)
            path = self.path / "trajectories" / f"{stem}.json"
            slot = self._slot(record)
            if self.official_trials and slot is not None and self._offsets[slot] >= 0:
                # A slot recorded again (a retry): the earlier attempt's rollout_trials/
                # entry is a link to this file, and keeps its own bytes: made first if the
                # mirror thread (one, in order) has not got to it yet.
                self._mirrors.wait()
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            # No fsync of its own: the journal's fsync is the commit point (module doc).
            write_bytes_in_place(path, data)
        if attempt.trial_dir is not None:
            self._scrub_trial(attempt.trial_dir)
            source, dest = attempt.trial_dir / "artifacts", self.path / "artifacts" / stem
            copied = ArtifactCopy(skipped=_skipped_before(attempt.trial_dir))
            if os.path.lexists(source) and not _nothing_to_copy(source, dest):
                # The rollout wrote these: no link is followed, sizes are capped, secrets
                # redacted.
                skipped = copied.skipped
                copied = copy_artifacts(
                    source, dest, redact=self.redact, limits=self.artifact_limits
                )
                copied.skipped[:0] = skipped
            if (note := copied.summary()) is not None:
                self.log(f"artifacts of {stem}: {note}")
        if self.official_trials:
            self._mirror(
                record,
                trajectory=self.path / "trajectories" / f"{stem}.json",
                document=document,
                artifacts=self.path / "artifacts" / stem if attempt.trial_dir is not None else None,
            )
        line = dumps(journal_entry(record)) + b"\n"
        with self._journal_lock:
            assert self._journal is not None
            offset = self._journal.tell()
            self._journal.write(line)
        return record, offset

    def _commit(self) -> None:
        with self._journal_lock:
            assert self._journal is not None
            self._journal.flush()
            os.fsync(self._journal.fileno())

    def _index(self, record: AttemptRecord, offset: int) -> None:
        slot = self._slot(record)
        if slot is not None:
            self._offsets[slot] = offset
            self._resumed[slot] = 0
            self._status[slot] = _STATUSES.index(record.status)

    def _scrub_trial(self, trial_dir: Path) -> None:
        # The rollout server wrote these itself, secrets and all: redact them in place, as
        # data. Never through a link: its target's bytes would land in the run directory.
        for name in ("trajectory.json", "diagnostics.json"):
            document = _read_trial(trial_dir, name)
            if document is None or self._holds_no_secret(document):
                continue
            redacted = self.redactor.redact_obj(document)
            if redacted != document:
                with contextlib.suppress(OSError):
                    write_trial_json(trial_dir, name, redacted)

    def _holds_no_secret(self, document: Any) -> bool:
        """True when no string of `document` (keys included) holds a secret."""
        return self.redactor.clean_json(dumps(document, default=str).decode())

    def log(self, line: str) -> None:
        text = f"{_now()} {self.redact(line)}\n"
        with self._log_lock:
            if self._log is None:
                return
            self._log.write(text)
            self._log.flush()

    # -- outputs --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def indexing(self) -> Iterator[Callable[[AttemptRecord], None]]:
        """index.jsonl and summary.jsonl (a byte-identical copy) from the records handed to
        the function it gives, in `records()` order: the caller's one pass over the journal
        (its metrics) writes them too, rather than a second read of every line. Written
        whole on a normal exit only."""
        index_path = self.path / "index.jsonl"
        with _atomic(index_path) as handle:

            def index(record: AttemptRecord) -> None:
                handle.write(json.dumps(index_row(record)) + "\n")

            yield index
        shutil.copyfile(index_path, self.path / "summary.jsonl")

    def write_outputs(
        self,
        *,
        status: str,
        summary: Mapping[str, Any],
        eval_run: Mapping[str, Any],
        indexed: bool = False,
    ) -> None:
        """index.jsonl, summary.jsonl, metrics.json (`indexed`: the first two are written
        already, by `indexing`)."""
        if not indexed:
            with self.indexing() as index:
                for record in self.records():
                    index(record)
        _write_json(
            self.path / "metrics.json",
            {"eval_run": {**eval_run, "status": status}, "summary": dict(summary)},
        )

    def note_provenance(self, **values: Any) -> None:
        """Record facts of this invocation that do not lock a resume (`replicas=2`) in the
        manifest's provenance; the latest invocation's value wins."""
        provenance = self.manifest.setdefault("provenance", {})
        if all(provenance.get(key) == value for key, value in values.items()):
            return
        provenance.update(values)
        _write_json(self.path / "manifest.json", self.manifest)

    def write_progress(self, progress: Mapping[str, Any]) -> None:
        _write_json(self.path / "progress.json", dict(progress))

    def close(self) -> None:
        self._writer.close()  # what is queued is written and committed first
        self._mirrors.close()  # and every rollout_trials/ entry is there
        for handle in (self._journal, self._log, self._lock):
            if handle is not None:
                handle.close()
        self._journal = self._log = self._lock = None

    def __enter__(self) -> RunDirectory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def redact_record(record: AttemptRecord, redact: Callable[[str], str]) -> AttemptRecord:
    """The record with its free-text fields redacted; its structure is never touched.

    redact_record(record, Redactor(["sk-live-1"]).redact).error_message  # '... [REDACTED]'
    """
    update = {
        name: redact(value)
        for name in ("error_type", "error_message", "reward_explanation")
        if (value := getattr(record, name)) is not None and redact(value) != value
    }
    return record.model_copy(update=update) if update else record


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
def _atomic(path: Path, *, sync: bool = True) -> Iterator[IO[str]]:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        handle = tmp.open("w", encoding="utf-8")
    except FileNotFoundError:  # the folder's first file (one mkdir, not one per attempt)
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = tmp.open("w", encoding="utf-8")
    with handle:
        yield handle
        if sync:
            handle.flush()
            os.fsync(handle.fileno())
    os.replace(tmp, path)


def _write_text(path: Path, text: str, *, sync: bool = True) -> None:
    with _atomic(path, sync=sync) as handle:
        handle.write(text)


_TRIAL_JSON_LIMIT = 64 * 1024 * 1024


def _read_trial(trial_dir: Path, name: str) -> Any:
    """`read_trial_json`, bounded by the file's own size: reading up to its 64 MiB limit makes
    Python allocate that much on every call (~50 us, twice per attempt). A missing file
    costs one lstat."""
    try:
        size = os.lstat(trial_dir / name).st_size
    except OSError:
        return None
    # A file that grows past its size meanwhile is refused, as one past the limit is.
    return read_trial_json(trial_dir, name, max_bytes=min(max(size, 1), _TRIAL_JSON_LIMIT))


def _skipped_before(trial_dir: Path) -> list[Skipped]:
    """What a sandbox's copy already left out of this trial's artifacts (`SKIPPED_NOTES`)."""
    notes = read_trial_json(trial_dir, SKIPPED_NOTES, max_bytes=1024 * 1024)
    if not isinstance(notes, list):
        return []
    return [
        Skipped(str(item[0]), str(item[1]))
        for item in notes
        if isinstance(item, list) and len(item) == 2
    ]


def _nothing_to_copy(source: Path, dest: Path) -> bool:
    """True when `source` is a plain, empty directory and `dest` does not exist: copying
    would only create an empty directory (most attempts write no artifacts)."""
    if os.path.islink(source) or os.path.lexists(dest):
        return False
    try:
        with os.scandir(source) as entries:
            return next(entries, None) is None
    except OSError:
        return False


def _write_json(path: Path, payload: Mapping[str, Any]) -> None:
    _write_text(path, json.dumps(payload, indent=2, default=str) + "\n")
