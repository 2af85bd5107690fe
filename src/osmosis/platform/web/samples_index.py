"""A run's attempts as the samples pages read them: filtered, sorted, searched, grouped by
row, paged and exported, from the run directory's journal.

    index = SampleIndex(run_dir, pass_threshold=1.0, dataset=DatasetFile(path, sha256))
    index.refresh()                                    # reads only what was appended since
    hits = index.query(SampleQuery(text="timeout", status="failed"))

The journal (`events.jsonl`) is the authority for what an attempt was (the latest line of a
slot wins, as a resume reads it) and holds what the database does not: the error message and
the dataset row each attempt ran. A live run's journal only grows, so a refresh reads the
new complete lines and nothing else; a run restarted with `--fresh` (a new file) is read
again from the start. Texts come from elsewhere and are read once per attempt: the input is
the dataset row's user prompt (the file is used only while its SHA-256 is the run's), or the
trajectory's first user message; the output is the trajectory's last assistant message.

Search is a case-insensitive match of every word (or "quoted phrase") of the query against
the first TEXT_CHARS characters of the input, of the output, and the error; it is a scan of
texts held in memory, so it costs the same on every query (10,000 attempts: see
bench/dashboard.py), and a query is at most MAX_QUERY characters and MAX_TERMS terms.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from osmosis.eval.results import official_layout
from osmosis.eval.results.compare import RowOutcome, row_outcomes
from osmosis.eval.results.metrics import pass_at_k_estimate
from osmosis.eval.results.records import AttemptRecord
from osmosis.platform.core.errors import ValidationFailed
from osmosis.platform.web.trajectory import MAX_BYTES, final_output, first_user_message
from osmosis.vocabulary import ATTEMPT_STATUSES, OUTCOMES, outcome, passes
from osmosis.wire.runs import ATTEMPT_SORTS

JOURNAL = "events.jsonl"
TEXT_CHARS = 4_000
MAX_QUERY = 200
MAX_TERMS = 8
_TERM = re.compile(r'"([^"]+)"|(\S+)')


@dataclass(frozen=True)
class DatasetFile:
    """The file a run's rows came from, and the SHA-256 the run recorded for it (None: the
    file is trusted as it is, as for the platform's content-addressed blobs)."""

    path: Path
    sha256: str | None = None

    @classmethod
    def of_local_run(cls, manifest: dict[str, Any]) -> DatasetFile | None:
        """The file a local run read its rows from, as its `manifest.json` records it."""
        provenance = manifest.get("provenance")
        inputs = manifest.get("inputs")
        where = provenance.get("dataset_path") if isinstance(provenance, dict) else None
        dataset = inputs.get("dataset") if isinstance(inputs, dict) else None
        sha256 = dataset.get("sha256") if isinstance(dataset, dict) else None
        return cls(Path(where), sha256) if isinstance(where, str) and where else None


@dataclass(frozen=True)
class RowInput:
    system: str | None
    user: str | None
    label: str | None
    source: str  # "dataset" or "trajectory"


@dataclass(slots=True)
class Sample:
    """One recorded attempt, with its texts once they are read."""

    row_index: int
    run_index: int
    rollout_id: str
    status: str
    duration_ms: float
    source_row_index: int | None = None
    reward: float | None = None
    tokens: int | None = None
    error_type: str | None = None
    error_message: str | None = None
    cost_usd: float | None = None
    reward_explanation: str | None = None
    finished_at: datetime | None = None
    endpoint: str | None = None
    node: str | None = None
    output: str | None = None
    trajectory_input: str | None = None
    texts_for: str | None = None  # the rollout_id whose trajectory filled the texts
    haystack: str | None = None

    @property
    def key(self) -> tuple[int, int]:
        return (self.row_index, self.run_index)


@dataclass(frozen=True)
class SampleQuery:
    """The samples list's filters and order, as the URL carries them."""

    status: str = ""
    min_reward: float | None = None
    max_reward: float | None = None
    sort: str = "row_index"
    text: str = ""
    outcome: str = ""
    """One of `osmosis.vocabulary.OUTCOMES` (`not_passed`, `errored`, ...), or any."""

    def __post_init__(self) -> None:
        problems = []
        if self.status and self.status not in ATTEMPT_STATUSES:
            problems.append(
                f"status must be one of {', '.join(ATTEMPT_STATUSES)}; got {self.status!r}"
            )
        if self.outcome and self.outcome not in OUTCOMES:
            problems.append(f"outcome must be one of {', '.join(OUTCOMES)}; got {self.outcome!r}")
        if self.sort not in ATTEMPT_SORTS:
            problems.append(f"sort must be one of {', '.join(ATTEMPT_SORTS)}; got {self.sort!r}")
        if len(self.text) > MAX_QUERY:
            problems.append(f"q is at most {MAX_QUERY} characters; got {len(self.text)}")
        elif len(terms(self.text)) > MAX_TERMS:
            problems.append(f"q has at most {MAX_TERMS} words or quoted phrases")
        if problems:
            raise ValidationFailed("; ".join(problems), details={"problems": problems})


def terms(text: str) -> list[str]:
    """The words and "quoted phrases" of a search, case-folded."""
    return [(a or b).casefold() for a, b in _TERM.findall(text) if (a or b).strip()]


@dataclass(frozen=True)
class RowGroup:
    """One dataset row of the run: its attempts that match, and its pass@k over them all."""

    row_index: int
    samples: list[Sample]
    attempts: int  # not skipped, matching or not
    passes: int
    pass_at_k: list[tuple[int, float]]


@dataclass(frozen=True)
class Neighbours:
    previous: Sample | None
    next: Sample | None
    position: int | None  # 1-based place in the list, None when the attempt is not in it
    total: int


Fallback = Callable[[], Iterable[Any]]


class SampleIndex:
    """Every recorded attempt of one run directory, kept current by `refresh`.

    `fallback` gives the attempts of a run that has no journal (an uploaded run's records,
    read from the database, once): attribute rows as `GET .../attempts` has them.
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        pass_threshold: float,
        dataset: DatasetFile | None = None,
        fallback: Fallback | None = None,
    ) -> None:
        self.run_dir = run_dir
        self._trajectories = str(run_dir / "trajectories")
        self.pass_threshold = pass_threshold
        self.dataset = dataset
        self.fallback = fallback
        self.skipped_lines = 0
        self.input_problem: str | None = None
        self._by_key: dict[tuple[int, int], Sample] = {}
        self._ordered: list[Sample] | None = None
        self._offset = 0
        self._inode: int | None = None
        self._inputs: dict[int, RowInput] = {}
        self._inputs_tried: set[int] = set()
        self._lock = threading.RLock()
        self.generation = 0  # changes whenever an attempt is added: a key for caches
        self._outcomes: tuple[int, float, dict[int, RowOutcome]] | None = None

    # -- reading the journal ------------------------------------------------------------
    def refresh(self) -> SampleIndex:
        """Read what the journal gained since the last call (all of it the first time)."""
        with self._lock:
            path = self.run_dir / JOURNAL
            try:
                stat = path.stat()
            except OSError:
                # No journal: an uploaded run, whose records never change; read them once.
                if self.fallback is not None and self._inode is None:
                    self._reset()
                    for row in self.fallback():
                        self._add(_from_row(row))
                    self._inode = -1
                return self
            if stat.st_ino != self._inode or stat.st_size < self._offset:
                self._reset()  # a new journal (`--fresh`): start again
                self._inode = stat.st_ino
            if stat.st_size > self._offset:
                self._read_from(path)
            return self

    def _reset(self) -> None:
        self._by_key, self._ordered, self._offset, self.skipped_lines = {}, None, 0, 0
        self._inputs, self._inputs_tried, self.input_problem = {}, set(), None
        self.generation += 1

    def _read_from(self, path: Path) -> None:
        with path.open("rb") as handle:
            handle.seek(self._offset)
            for line in handle:
                if not line.endswith(b"\n"):
                    break  # still being written: read it whole next time
                self._offset += len(line)
                try:
                    record = AttemptRecord.model_validate_json(line)
                except ValueError:
                    # A run the official osmosis-ai CLI wrote journals bare index rows.
                    official = official_layout.journal_record(
                        line, finished_at=official_layout.finished_at(self.run_dir)
                    )
                    if official is None:
                        self.skipped_lines += 1  # as a resume does: a corrupt line records nothing
                        continue
                    record = official
                self._add(_from_record(record))

    def _add(self, sample: Sample) -> None:
        old = self._by_key.get(sample.key)
        if old is not None and old.rollout_id == sample.rollout_id:
            sample.output, sample.trajectory_input = old.output, old.trajectory_input
            sample.texts_for, sample.haystack = old.texts_for, old.haystack
        self._by_key[sample.key] = sample
        self._ordered = None
        self.generation += 1

    # -- what is recorded ---------------------------------------------------------------
    @property
    def samples(self) -> list[Sample]:
        """Every attempt, in (row_index, run_index) order."""
        with self._lock:
            if self._ordered is None:
                self._ordered = [self._by_key[key] for key in sorted(self._by_key)]
            return self._ordered

    def get(self, row_index: int, run_index: int) -> Sample | None:
        return self._by_key.get((row_index, run_index))

    @property
    def state(self) -> tuple[int, int, int | None]:
        """Changes whenever what the index holds does: a key for caches of its results."""
        return (self.generation, self._offset, self._inode)

    def outcomes(self, pass_threshold: float) -> dict[int, RowOutcome]:
        """Each row's outcome, as `osmosis.eval.results.compare` reduces attempts (kept until an
        attempt is added)."""
        with self._lock:
            cached = self._outcomes
            if cached is None or cached[:2] != (self.generation, pass_threshold):
                # Plain dicts: the metrics read them fastest.
                rows = [
                    {"row_index": s.row_index, "status": s.status, "reward": s.reward}
                    for s in self.samples
                ]
                cached = (self.generation, pass_threshold, row_outcomes(rows, pass_threshold))
                self._outcomes = cached
            return cached[2]

    def __len__(self) -> int:
        return len(self._by_key)

    @property
    def n_runs(self) -> int:
        return max((s.run_index for s in self._by_key.values()), default=-1) + 1

    # -- texts ----------------------------------------------------------------------------
    def input_of(self, sample: Sample) -> RowInput | None:
        """The row's prompt as the dataset has it, else as the trajectory recorded it."""
        self.with_texts([sample])
        if sample.source_row_index is not None and sample.source_row_index in self._inputs:
            return self._inputs[sample.source_row_index]
        if sample.trajectory_input is not None:
            return RowInput(None, sample.trajectory_input, None, "trajectory")
        return None

    def with_texts(self, samples: list[Sample]) -> list[Sample]:
        """`samples`, each with its input and output read (once per attempt)."""
        with self._lock:
            self._load_inputs(
                {s.source_row_index for s in samples if s.source_row_index is not None}
            )
            for sample in samples:
                if sample.texts_for != sample.rollout_id:
                    self._read_trajectory(sample)
        return samples

    def _read_trajectory(self, sample: Sample) -> None:
        # A string, not a Path: a search builds ten thousand of these.
        path = f"{self._trajectories}/row_{sample.row_index}_run_{sample.run_index}.json"
        document: Any = None
        try:
            # One open that refuses a link, then its size: a search opens every one of these.
            with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as handle:
                if os.fstat(handle.fileno()).st_size <= MAX_BYTES:
                    document = json.loads(handle.read().decode("utf-8", "replace"))
        except (OSError, ValueError, RecursionError):
            document = None
        if isinstance(document, dict):
            sample.output = _cut(final_output(document))
            sample.trajectory_input = _cut(first_user_message(document))
        sample.texts_for, sample.haystack = sample.rollout_id, None

    def _load_inputs(self, wanted: set[int]) -> None:
        missing = sorted(wanted - self._inputs_tried)
        if not missing or self.dataset is None:
            return
        self._inputs_tried.update(missing)
        problem = _dataset_problem(self.dataset)
        if problem:
            self.input_problem = problem
            return
        from osmosis.eval.inputs.dataset import DatasetError, read_rows

        try:
            for row in read_rows(self.dataset.path, missing):
                by_role = {m.get("role"): m.get("content") for m in row.messages}
                self._inputs[row.source_row_index] = RowInput(
                    system=_cut(by_role.get("system")),
                    user=_cut(by_role.get("user")),
                    label=_cut(row.label),
                    source="dataset",
                )
        except (DatasetError, OSError, ValueError) as error:
            self.input_problem = f"the dataset file cannot be read: {error}"

    def _haystack(self, sample: Sample) -> str:
        if sample.haystack is None:
            source = sample.source_row_index
            row = self._inputs.get(source) if source is not None else None
            parts = (
                row.user if row is not None else sample.trajectory_input,
                sample.output,
                sample.error_type,
                sample.error_message,
            )
            sample.haystack = "\n".join(part for part in parts if part).casefold()
        return sample.haystack

    # -- queries --------------------------------------------------------------------------
    def query(self, query: SampleQuery) -> list[Sample]:
        """The attempts `query` admits, in its order; a search reads every text first."""
        with self._lock:
            chosen = [s for s in self.samples if _admits(query, s, self.pass_threshold)]
            words = terms(query.text)
            if words:
                self.with_texts(chosen)
                chosen = [s for s in chosen if all(w in self._haystack(s) for w in words)]
            return _sorted(chosen, query.sort)

    def groups(self, chosen: list[Sample]) -> list[RowGroup]:
        """`chosen` grouped by row (in row order), each row with its pass@k over every one of
        its recorded attempts, at k = 1, 2, 4, ... up to the run's attempts per row."""
        by_row: dict[int, list[Sample]] = {}
        for sample in chosen:
            by_row.setdefault(sample.row_index, []).append(sample)
        tallies: dict[int, list[int]] = {}
        for sample in self.samples:
            if sample.row_index in by_row and sample.status != "skipped":
                tally = tallies.setdefault(sample.row_index, [0, 0])
                tally[0] += 1
                tally[1] += passes(sample.reward, self.pass_threshold)
        ks = [1 << p for p in range(max(self.n_runs, 1).bit_length())]
        out = []
        for row in sorted(by_row):
            attempts, passed = tallies.get(row, [0, 0])
            curve = [(k, pass_at_k_estimate(attempts, passed, k)) for k in ks if k <= attempts]
            out.append(RowGroup(row, by_row[row], attempts, passed, curve))
        return out

    def neighbours(self, query: SampleQuery, key: tuple[int, int]) -> Neighbours:
        """The attempts before and after `key` in the list `query` makes."""
        chosen = self.query(query)
        for position, sample in enumerate(chosen):
            if sample.key == key:
                return Neighbours(
                    previous=chosen[position - 1] if position else None,
                    next=chosen[position + 1] if position + 1 < len(chosen) else None,
                    position=position + 1,
                    total=len(chosen),
                )
        return Neighbours(None, chosen[0] if chosen else None, None, len(chosen))

    def outcome_of(self, sample: Sample) -> str:
        """What the attempt came to at this run's threshold (`osmosis.vocabulary.outcome`)."""
        return outcome(sample.status, sample.reward, self.pass_threshold)

    def csv_rows(self, query: SampleQuery) -> Iterator[list[Any]]:
        """The samples table as CSV rows, header first, in the list's order."""
        yield list(CSV_COLUMNS)
        chosen = self.query(query)
        for start in range(0, len(chosen), 500):
            for sample in self.with_texts(chosen[start : start + 500]):
                row = self.input_of(sample)
                yield [
                    sample.row_index,
                    sample.run_index,
                    sample.status,
                    sample.reward,
                    sample.tokens,
                    sample.duration_ms,
                    sample.error_type,
                    _safe_cell(sample.error_message),
                    _safe_cell(row.user if row else None),
                    _safe_cell(row.label if row else None),
                    _safe_cell(sample.output),
                    sample.rollout_id,
                    self.outcome_of(sample),
                ]


CSV_COLUMNS = (
    "row_index",
    "run_index",
    "status",
    "reward",
    "tokens",
    "duration_ms",
    "error_type",
    "error_message",
    "input",
    "expected",  # the row's label: what the grader compares the output with
    "output",
    "rollout_id",
    "outcome",
)


def _admits(query: SampleQuery, sample: Sample, threshold: float) -> bool:
    if query.status and sample.status != query.status:
        return False
    if query.outcome and outcome(sample.status, sample.reward, threshold) != query.outcome:
        return False
    if query.min_reward is not None or query.max_reward is not None:
        if sample.reward is None:
            return False
        if query.min_reward is not None and sample.reward < query.min_reward:
            return False
        if query.max_reward is not None and sample.reward > query.max_reward:
            return False
    return True


def _sorted(samples: list[Sample], sort: str) -> list[Sample]:
    """As the database orders `GET .../attempts`: the key (missing values last), then row
    and attempt."""
    name, descending = sort.lstrip("-"), sort.startswith("-")
    sign = -1 if descending else 1
    if name == "row_index":
        return (
            samples
            if not descending
            else sorted(samples, key=lambda s: (-s.row_index, s.run_index))
        )
    present = [s for s in samples if getattr(s, name) is not None]
    present.sort(key=lambda s: (sign * getattr(s, name), s.row_index, s.run_index))
    return present + [s for s in samples if getattr(s, name) is None]


def _cut(text: Any) -> str | None:
    if text is None:
        return None
    value = text if isinstance(text, str) else json.dumps(text, ensure_ascii=False, default=repr)
    return value if len(value) <= TEXT_CHARS else value[:TEXT_CHARS] + "…"


def _safe_cell(text: str | None) -> str | None:
    # A spreadsheet runs a cell that starts like a formula; model output may well do so.
    if text and text[0] in "=+-@\t\r":
        return "'" + text
    return text


def _dataset_problem(dataset: DatasetFile) -> str | None:
    from osmosis.platform.services.run_files import _sha256  # cached per (path, size, mtime, inode)

    try:
        stat = dataset.path.stat()
    except OSError:
        return f"the dataset file {dataset.path.name} is no longer there"
    if dataset.sha256 is None:
        return None
    found = _sha256(str(dataset.path), stat.st_size, stat.st_mtime_ns, stat.st_ino)
    if found != dataset.sha256:
        return f"the dataset file {dataset.path.name} changed since the run"
    return None


def _from_record(record: AttemptRecord) -> Sample:
    return Sample(
        row_index=record.row_index,
        run_index=record.run_index,
        rollout_id=record.rollout_id,
        status=record.status,
        duration_ms=record.duration_ms,
        source_row_index=record.source_row_index,
        reward=record.reward,
        tokens=record.tokens,
        error_type=record.error_type,
        error_message=record.error_message,
        reward_explanation=record.reward_explanation,
        cost_usd=record.cost_usd,
        finished_at=record.finished_at,
        endpoint=getattr(record, "endpoint", None),
        node=getattr(record, "node", None),
    )


def _from_row(row: Any) -> Sample:
    return Sample(
        row_index=int(row.row_index),
        run_index=int(row.run_index),
        rollout_id=str(row.rollout_id),
        status=str(row.status),
        duration_ms=float(row.duration_ms or 0.0),
        reward=row.reward,
        tokens=row.tokens,
        error_type=row.error_type,
        cost_usd=getattr(row, "cost_usd", None),
        finished_at=getattr(row, "finished_at", None),
    )


@dataclass
class IndexCache:
    """The indexes of the runs looked at last, so a refresh reads only new journal lines."""

    size: int = 8
    _items: dict[str, SampleIndex] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, key: str, make: Callable[[], SampleIndex]) -> SampleIndex:
        with self._lock:
            index = self._items.pop(key, None) or make()
            self._items[key] = index  # most recent last
            while len(self._items) > self.size:
                self._items.pop(next(iter(self._items)))
        return index.refresh()
