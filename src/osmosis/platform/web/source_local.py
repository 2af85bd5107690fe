"""Local run directories as a dashboard source, for `osmosis eval view` (read-only).

    source = LocalSource(Path(".osmosis/evals"))     # every run under it
    source = LocalSource(Path(".osmosis/evals/try1"))  # just that one
    run = source.find("try1")

A run directory is what `osmosis eval run` writes (`osmosis.eval.host.run_dir`); this module only
reads it, and copes with one being written right now:

- status: `running` while `eval run` holds the run's lock (`<root>/.locks/<name>.lock`,
  seen in /proc/locks without touching it, so a viewer can never make `eval run` refuse to
  start); otherwise metrics.json's `finished`/`incomplete`; no metrics.json (a run killed
  before its end) is `incomplete`.
- numbers: metrics.json's summary when it is newer than the journal; otherwise (a running
  run, or one killed after a resume) the same `summarize` over the journal, so results are
  live.
- a platform run fetched with `eval download` (no manifest, no journal): the platform's
  status (finished, failed, stopped, halted) and figures from its metrics.json, its attempts
  from its `summary.jsonl` (`official_layout.records`); what it does not carry (config,
  entrypoint, the planned total of an unfinished run) is shown as not recorded.
"""

from __future__ import annotations

import fcntl
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from osmosis.eval.results import official_layout
from osmosis.eval.results.metrics import summarize
from osmosis.platform.web.samples_index import JOURNAL, DatasetFile, IndexCache, SampleIndex
from osmosis.platform.web.session import Viewer
from osmosis.platform.web.source import (
    FilterChoices,
    RunDetail,
    RunFilters,
    RunNotFound,
    RunsPage,
    RunView,
    Tally,
)
from osmosis.vocabulary import LOCAL_RUN_STATUSES

MAX_JSON_BYTES = 16 * 1024 * 1024
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
NOT_RECORDED = "not recorded"


class LocalSource:
    """Run directories under `root` (or `root` itself when it is one run)."""

    viewer: Viewer | None = None
    read_only = True

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.single = is_run_dir(self.root)
        self._indexes = IndexCache()

    # -- finding runs ---------------------------------------------------------------------
    def _run_dirs(self) -> list[Path]:
        if self.single:
            return [self.root]
        try:
            entries = list(os.scandir(self.root))
        except OSError:
            return []
        return [
            Path(entry.path)
            for entry in entries
            if not entry.name.startswith(".")
            and entry.is_dir(follow_symlinks=False)
            and is_run_dir(Path(entry.path))
        ]

    def run_count(self) -> int:
        return len(self._run_dirs())

    def find(self, ref: str) -> RunView:
        path = self._path_of(ref)
        if path is None:
            raise RunNotFound(f"no local run {ref!r} in {self.root}", details={"eval_run": ref})
        return self._view(path, detail=True)

    def _path_of(self, ref: str) -> Path | None:
        if not ref or "/" in ref or "\\" in ref or ref.startswith("."):
            return None
        if self.single:
            return self.root if ref == self.root.name else None
        path = self.root / ref
        if path.is_symlink() or not path.is_dir() or not is_run_dir(path):
            return None
        return path

    def run_dir(self, run: RunView) -> Path:
        path = self._path_of(run.ref)
        if path is None:  # gone since the page looked it up
            raise RunNotFound(f"no local run {run.ref!r} in {self.root}")
        return path

    def list_runs(self, filters: RunFilters, *, limit: int, offset: int) -> RunsPage:
        views = [self._view(path, detail=False) for path in self._run_dirs()]
        chosen = sorted(
            (view for view in views if filters.admits(view)),
            key=lambda view: (view.created_at or _EPOCH, view.ref),
            reverse=True,
        )
        params: dict[str, Any] = filters.params()
        return RunsPage(
            rows=chosen[offset : offset + limit],
            total=len(chosen),
            offset=offset,
            limit=limit,
            params=params,
        )

    def filter_choices(self) -> FilterChoices:
        views = [self._view(path, detail=False) for path in self._run_dirs()]
        # Downloaded platform runs add theirs (failed, stopped, halted).
        seen = sorted({v.status for v in views} - set(LOCAL_RUN_STATUSES))
        return FilterChoices(
            statuses=(*LOCAL_RUN_STATUSES, *seen),
            datasets=sorted({v.dataset for v in views if v.dataset}),
            models=sorted({v.model for v in views if v.model}),
            rollouts=sorted({v.rollout for v in views if v.rollout}),
        )

    # -- one run --------------------------------------------------------------------------
    def _files(self, path: Path) -> _RunFiles:
        return _RunFiles(path, running=is_locked(path.parent / ".locks" / f"{path.name}.lock"))

    def _view(self, path: Path, *, detail: bool) -> RunView:
        files = self._files(path)
        manifest, eval_run = files.manifest, files.eval_run
        inputs = _mapping(manifest.get("inputs"))
        provenance = _mapping(manifest.get("provenance"))
        summary = self._summary(path, files)
        total = files.total or int(_number(summary.get("total_samples")) or 0)
        if files.running:
            status = "running"
        elif files.metrics_current:
            status = str(eval_run.get("status") or "incomplete")
        elif files.downloaded:
            status = NOT_RECORDED  # attempts without metrics.json: the platform's status unknown
        else:
            recorded = int(_number(summary.get("total_samples")) or 0)
            status = "finished" if total and recorded >= total else "incomplete"
        stats = _mapping(summary.get("reward_stats"))
        completed = int(_number(summary.get("total_samples")) or 0)
        tally = Tally(
            completed=completed,
            total=max(total, completed),
            graded=int(_number(summary.get("graded")) or 0),
            passed=int(_number(summary.get("passed")) or 0),
            failed=int(_number(summary.get("failed")) or 0),
            skipped=int(_number(summary.get("skipped")) or 0),
            tokens=int(_number(summary.get("tokens_used")) or 0),
            avg_reward=_number(stats.get("mean")),
            pass_rate=_number(summary.get("pass_rate")) if completed else None,
            recorded_outcomes=_counts(summary.get("outcomes")),
        )
        dataset_path = provenance.get("dataset_path")
        missing = NOT_RECORDED if files.downloaded else ""
        halted = eval_run.get("halted")
        return RunView(
            ref=path.name,
            id=str(manifest.get("local_run_id") or eval_run.get("id") or path.name),
            name=path.name,
            status=status,
            dataset=str(
                eval_run.get("dataset_name")
                or (Path(dataset_path).stem if dataset_path else missing)
            ),
            model=str(inputs.get("model_path") or eval_run.get("model_name") or missing),
            rollout=str(
                _mapping(inputs.get("rollout")).get("name")
                or (eval_run.get("rollout_name") if files.downloaded else None)
                or missing
            ),
            tally=tally,
            created_at=_when(manifest.get("created_at") or eval_run.get("started_at")),
            started_at=_when(eval_run.get("started_at") or manifest.get("created_at")),
            completed_at=_when(eval_run.get("completed_at")) if not files.running else None,
            duration_ms=_number(eval_run.get("duration_ms")) if not files.running else None,
            # The engine's reason a platform run stopped dispatching (its budget, an outage).
            error=str(halted) if files.downloaded and halted and status != "finished" else None,
            detail=_detail(manifest, summary, files) if detail else None,
        )

    def _summary(self, path: Path, files: _RunFiles) -> dict[str, Any]:
        if files.metrics_current:
            return _mapping(files.metrics.get("summary"))
        return summarize(self.samples_at(path, files).samples, files.pass_threshold)

    def results(self, run: RunView) -> dict[str, Any]:
        path = self.run_dir(run)
        return self._summary(path, self._files(path))

    def rewards(self, run: RunView) -> list[float]:
        return [
            s.reward
            for s in self.samples(run).samples
            if s.reward is not None and s.status != "skipped"
        ]

    def samples(self, run: RunView) -> SampleIndex:
        path = self.run_dir(run)
        return self.samples_at(path, self._files(path))

    def samples_at(self, path: Path, files: _RunFiles) -> SampleIndex:
        def make() -> SampleIndex:
            return SampleIndex(
                path,
                pass_threshold=files.pass_threshold,
                dataset=DatasetFile.of_local_run(dict(files.manifest)),
                # A downloaded run has no journal: its attempts are the platform's index rows.
                fallback=(lambda: downloaded_records(path)) if files.downloaded else None,
            )

        # A run restarted with --fresh has a new manifest, so a new index; a download again
        # rewrites the index, so a downloaded run's key is the index file's time.
        version = (
            _mtime(path / official_layout.DOWNLOAD_INDEX)
            if files.downloaded
            else files.manifest.get("local_run_id")
        )
        return self._indexes.get(f"{path}|{version}", make)


class _RunFiles:
    """The small JSON files of one run directory, read once per page."""

    def __init__(self, path: Path, *, running: bool) -> None:
        self.running = running
        self.downloaded = official_layout.is_download_dir(path)
        self.manifest = _read_json(path / "manifest.json")
        self.metrics = _read_json(path / "metrics.json")
        self.eval_run = _mapping(self.metrics.get("eval_run"))
        progress = _read_json(path / "progress.json")
        self.total = int(_number(progress.get("total_runs")) or 0)
        threshold = _number(_mapping(self.manifest.get("inputs")).get("pass_threshold"))
        # The official CLI and a downloaded platform run keep it in metrics.json only.
        self.pass_threshold = (
            official_layout.pass_threshold(path) if threshold is None else threshold
        )
        # metrics.json is the run's own answer unless attempts were recorded after it. Strictly
        # newer: file times tick coarsely, and an equal time may hide a later line (then the
        # journal gives the same numbers, the same way, only later).
        self.metrics_current = (
            not running
            and bool(self.metrics)
            and _mtime(path / "metrics.json") > _mtime(path / JOURNAL)
        )


def _detail(manifest: dict[str, Any], summary: dict[str, Any], files: _RunFiles) -> RunDetail:
    inputs = _mapping(manifest.get("inputs"))
    provenance = _mapping(manifest.get("provenance"))
    selection = _mapping(provenance.get("selection"))
    timeouts = _mapping(inputs.get("timeouts"))
    rollout = _mapping(inputs.get("rollout"))
    dataset = _mapping(inputs.get("dataset"))
    config: dict[str, Any] = {
        "limit": selection.get("limit"),
        "rows": selection.get("rows"),
        "selection": selection.get("method"),
        "n": inputs.get("n"),
        "pass_threshold": inputs.get("pass_threshold", files.pass_threshold),
        **timeouts,
        "model_path": inputs.get("model_path"),
        **_mapping(provenance.get("advanced")),
    }
    errors = _mapping(summary.get("errors_by_type"))
    missing = NOT_RECORDED if files.downloaded else ""
    return RunDetail(
        config={key: value for key, value in config.items() if value is not None},
        config_path=str(provenance.get("config_path") or missing),
        entrypoint=str(rollout.get("entrypoint") or missing),
        branch=provenance.get("config_branch") or provenance.get("git_branch"),
        commit_sha=provenance.get("config_commit_sha") or provenance.get("git_head"),
        env=_mapping(inputs.get("env")),
        secret_scopes={str(name): "local" for name in inputs.get("secrets") or []},
        dataset_rows=_int(selection.get("total_rows")),
        dataset_sha256=dataset.get("sha256"),
        rows_digest=dataset.get("selected_source_rows"),
        pass_threshold=files.pass_threshold,
        cost_usd=_number(summary.get("cost_usd")),
        errors_by_type={str(k): int(v) for k, v in errors.items() if isinstance(v, int)},
    )


def is_run_dir(path: Path) -> bool:
    """A directory `eval run` wrote (it has a manifest or a journal), or one `eval download`
    wrote (`official_layout.is_download_dir`)."""
    return (
        (path / "manifest.json").is_file()
        or (path / JOURNAL).is_file()
        or official_layout.is_download_dir(path)
    )


def downloaded_records(path: Path) -> list[Any]:
    """The attempts of a downloaded platform run, from its index (`summary.jsonl`)."""
    return list(official_layout.records(path, index=official_layout.DOWNLOAD_INDEX))


def is_locked(lock: Path) -> bool:
    """Whether a process holds `eval run`'s lock on this file right now."""
    try:
        stat = lock.stat()
    except OSError:
        return False
    try:
        table = Path("/proc/locks").read_text()
    except OSError:
        return _probe(lock)
    wanted = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino} "
    return any("FLOCK" in line and wanted in line for line in table.splitlines())


def _probe(lock: Path) -> bool:
    # Without /proc/locks: a shared lock taken and dropped at once. A run starting in that
    # instant would be refused ("being run by another process") and can simply be started again.
    try:
        with lock.open("rb") as handle:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(handle, fcntl.LOCK_UN)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False


def _read_json(path: Path) -> dict[str, Any]:
    try:
        if path.is_symlink() or path.stat().st_size > MAX_JSON_BYTES:
            return {}
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}  # absent, or being replaced this instant: the next refresh reads it
    return value if isinstance(value, dict) else {}


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _counts(value: Any) -> dict[str, int] | None:
    """A `{name: count}` mapping from metrics.json, or None when it holds none."""
    if not isinstance(value, dict):
        return None
    return {str(k): int(v) for k, v in value.items() if _number(v) is not None}


def _int(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None else None


def _when(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        stamp = datetime.fromisoformat(value)
    except ValueError:
        return None
    return stamp if stamp.tzinfo else stamp.astimezone()
