"""The official osmosis-ai local-run layout, read and converted to ours in one place.

The official `osmosis eval run` (osmosis-ai 0.3.x) writes `.osmosis/evals/<name>/` with
`manifest.json` (no `inputs.pass_threshold`), a journal of bare index rows, `index.jsonl`,
`progress.json`, `metrics.json`, `logs.txt` and `rollout_trials/<rollout_id>/{trajectory*.json,
artifacts/**}`. Its `eval upload` sends only `index.jsonl`, `progress.json`, `logs.txt` and
`rollout_trials/...`, with the run's description (threshold, model, dataset...) in the request.

    is_official_run_dir(path)                 # a directory the official CLI wrote
    records(path)                             # [AttemptRecord, ...] from its index.jsonl
    files = upload_files(path)                # what the official `eval upload` sends
    run = upload_run(path)                    # the `run` object it describes the run with
    convert(official_dir, target, run=..., local_run_id=..., provenance=...)  # our layout

A platform run fetched with `osmosis eval download` (`metrics.json`, `summary.jsonl`,
`trajectories/`, `artifacts/`, `logs.txt`, no manifest) reads through here too: its
`summary.jsonl` is the engine's `index.jsonl`, byte for byte.

    is_download_dir(path)                     # a directory `eval download` wrote
    records(path, index=DOWNLOAD_INDEX)       # its attempts

The command line (`eval info/view/compare/upload`) and the server (`eval upload` imports)
both go through here, so an official run reads the same everywhere.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any, Final

from osmosis.eval.inputs.dataset_formats import sha256_file
from osmosis.eval.results.metrics import summarize
from osmosis.eval.results.records import AttemptRecord, index_row, journal_entry
from osmosis.eval.results.run_export import ExportFile
from osmosis.rollout.trajectory import ATIF_FINAL_METRICS, ATIF_STEP_METRICS, conformant_metrics
from osmosis.vocabulary import DEFAULT_PASS_THRESHOLD

__all__ = [
    "DOWNLOAD_INDEX",
    "OFFICIAL_TOP_LEVEL",
    "atif_conformant",
    "check",
    "convert",
    "finished_at",
    "is_download_dir",
    "is_official_path",
    "is_official_run_dir",
    "journal_record",
    "mirror_trial",
    "pass_threshold",
    "records",
    "selection_digest",
    "upload_files",
    "upload_run",
]

OFFICIAL_TOP_LEVEL: Final = ("index.jsonl", "progress.json", "logs.txt")
"""The top-level files the official `eval upload` sends (index and progress are required)."""

DOWNLOAD_INDEX: Final = "summary.jsonl"
"""The attempts of a downloaded platform run: the engine's index rows (`eval download`)."""

_ROLLOUT_ID = re.compile(r"^[0-9a-f]{32}$")
_TRAJECTORY = re.compile(r"^trajectory[A-Za-z0-9._-]*\.json$")
_FAILED_WITHOUT_TYPE: Final = "rollout_failed"  # what the official runner records then


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def _obj(value: object) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def is_official_run_dir(path: Path) -> bool:
    """Whether `path` is a run directory the official CLI wrote: its manifest records no pass
    threshold (ours always does; the official keeps it in metrics.json)."""
    manifest = _json(path / "manifest.json")
    if not isinstance(manifest, Mapping):
        return False
    return "pass_threshold" not in _obj(manifest.get("inputs"))


def is_download_dir(path: Path) -> bool:
    """Whether `path` holds a platform run as `osmosis eval download` (or `eval info`, which
    saves metrics.json) writes it: no manifest, and its metrics.json or its index."""
    return not (path / "manifest.json").exists() and (
        (path / "metrics.json").is_file() or (path / DOWNLOAD_INDEX).is_file()
    )


def pass_threshold(path: Path) -> float:
    """The official run's pass threshold: `metrics.json` summary, else the default."""
    value = _obj(_obj(_json(path / "metrics.json")).get("summary")).get("pass_threshold")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return DEFAULT_PASS_THRESHOLD


def selection_digest(spec: object) -> str | None:
    """The official `selected_source_rows` (`"0-9,12"`) as ours spells it: the row count and
    the SHA-256 of the rows in order (`osmosis.eval.host.plan`), so a run of each over the
    same rows compares. None when `spec` is not such a selector."""
    if not isinstance(spec, str) or not re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", spec):
        return None
    rows: list[int] = []
    for part in spec.split(","):
        low, _, high = part.partition("-")
        rows.extend(range(int(low), int(high or low) + 1))
    digest = hashlib.sha256()
    for index in rows:
        digest.update(index.to_bytes(8, "little"))
    return f"{len(rows)}:{digest.hexdigest()[:32]}"


def _index_rows(path: Path, index: str = "index.jsonl") -> list[dict[str, Any]]:
    rows = []
    try:
        lines = (path / index).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line being written
        if isinstance(row, dict):
            rows.append(row)
    return rows


def _source_rows(path: Path) -> dict[tuple[int, int], int]:
    """`source_row_index` per attempt from the official journal (index.jsonl omits it)."""
    found: dict[tuple[int, int], int] = {}
    try:
        lines = (path / "events.jsonl").read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return found
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict):
            continue
        key = (entry.get("row_index"), entry.get("run_index"), entry.get("source_row_index"))
        if all(isinstance(part, int) for part in key):
            found[(int(key[0]), int(key[1]))] = int(key[2])  # type: ignore[arg-type]
    return found


def _record(
    row: Mapping[str, Any], *, source_row: int | None, finished_at: datetime
) -> AttemptRecord:
    status = row.get("status")
    error_type = row.get("error_type") if status == "failed" else None
    if status == "failed" and not (isinstance(error_type, str) and error_type):
        error_type = _FAILED_WITHOUT_TYPE
    reward = row.get("reward") if status != "skipped" else None
    duration = row.get("duration_ms", 0.0)
    return AttemptRecord(
        row_index=row["row_index"],
        run_index=row["run_index"],
        rollout_id=row["rollout_id"],
        source_row_index=row["row_index"] if source_row is None else source_row,
        status=status,  # AttemptRecord validates it
        reward=float(reward) if isinstance(reward, int | float) else None,
        tokens=row.get("tokens"),
        duration_ms=float(duration) if isinstance(duration, int | float) else 0.0,
        error_type=error_type,
        trajectory_filename=row.get("trajectory_filename"),
        resumed=row.get("resumed") is True,
        finished_at=finished_at,
    )


def journal_record(line: bytes, *, finished_at: datetime) -> AttemptRecord | None:
    """One line of the official journal (`events.jsonl`: a bare index row plus
    `source_row_index`) as our record; None for anything else, a line of ours included (ours
    carry `schema_version` and `finished_at`, which the official's never do)."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    if not isinstance(row, dict) or "schema_version" in row or "finished_at" in row:
        return None
    source = row.get("source_row_index")
    try:
        return _record(
            row, source_row=source if isinstance(source, int) else None, finished_at=finished_at
        )
    except (KeyError, TypeError, ValueError):
        return None


def finished_at(path: Path) -> datetime:
    """When an official run directory's attempts ended, as near as it says."""
    return _finished_at(path)


def _finished_at(path: Path, index: str = "index.jsonl") -> datetime:
    completed = _obj(_obj(_json(path / "metrics.json")).get("eval_run")).get("completed_at")
    if isinstance(completed, str):
        try:
            moment = datetime.fromisoformat(completed)
            return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
        except ValueError:
            pass
    try:
        return datetime.fromtimestamp((path / index).stat().st_mtime, tz=UTC)
    except OSError:
        return datetime.now(UTC)


def records(path: Path, *, index: str = "index.jsonl") -> list[AttemptRecord]:
    """Every attempt of an official run directory (or an uploaded official layout), in row
    order; a row that is not a valid attempt is left out. `index=DOWNLOAD_INDEX` reads a
    downloaded platform run."""
    sources = _source_rows(path)
    finished_at = _finished_at(path, index)
    latest: dict[tuple[int, int], AttemptRecord] = {}
    for row in _index_rows(path, index):
        try:
            key = (row["row_index"], row["run_index"])
            latest[key] = _record(row, source_row=sources.get(key), finished_at=finished_at)
        except (KeyError, TypeError, ValueError):
            continue
    return [latest[key] for key in sorted(latest)]


# -- the official upload ----------------------------------------------------------------------
def is_official_path(path: str) -> bool:
    """Whether `path` is one the official `eval upload` sends (and so a server may store)."""
    pure = PurePosixPath(path)
    parts = pure.parts
    if (
        not parts
        or pure.is_absolute()
        or "\\" in path
        or any(p in ("", ".", "..") for p in path.split("/"))
        or any(ord(c) < 32 or c == "\x7f" for c in path)
        or any(len(part.encode()) > 255 for part in parts)
    ):
        return False
    if len(parts) == 1:
        return path in OFFICIAL_TOP_LEVEL
    if parts[0] != "rollout_trials" or len(parts) < 3 or not _ROLLOUT_ID.fullmatch(parts[1]):
        return False
    if len(parts) == 3:
        return bool(_TRAJECTORY.fullmatch(parts[2]))
    return parts[2] == "artifacts" and not (len(parts) == 4 and parts[3] == "manifest.json")


def _walk(root: Path) -> Iterator[Path]:
    for directory, dirs, names in os.walk(root):  # never follows a link
        dirs.sort()
        for name in sorted(names):
            yield Path(directory) / name


def upload_files(path: Path) -> list[ExportFile]:
    """What the official `eval upload` sends from an official run directory: index, progress,
    logs, and each indexed attempt's trajectory and artifacts under `rollout_trials/`."""
    chosen: list[str] = [n for n in OFFICIAL_TOP_LEVEL if (path / n).is_file()]
    for row in _index_rows(path):
        rollout_id = row.get("rollout_id")
        if not (isinstance(rollout_id, str) and _ROLLOUT_ID.fullmatch(rollout_id)):
            continue
        trial = path / "rollout_trials" / rollout_id
        name = row.get("trajectory_filename")
        if isinstance(name, str) and (trial / name).is_file():
            chosen.append(f"rollout_trials/{rollout_id}/{name}")
        for file in _walk(trial / "artifacts"):
            relative = file.relative_to(path).as_posix()
            if file.is_file() and not file.is_symlink() and is_official_path(relative):
                chosen.append(relative)
    return [
        ExportFile(p, (path / p).stat().st_size, sha256_file(path / p))
        for p in sorted(dict.fromkeys(chosen))
    ]


def upload_run(path: Path) -> dict[str, Any]:
    """The `run` object the official `eval upload` describes an official run with."""
    manifest = _obj(_json(path / "manifest.json"))
    metrics = _obj(_json(path / "metrics.json"))
    inputs, info = _obj(manifest.get("inputs")), _obj(metrics.get("eval_run"))
    rollout, dataset = _obj(inputs.get("rollout")), _obj(inputs.get("dataset"))
    return {
        "name": manifest.get("run_name") or path.name,
        "started_at": info.get("started_at"),
        "completed_at": info.get("completed_at"),
        "experiment_config": {
            "rollout": {"name": rollout.get("name"), "source_digest": rollout.get("source_digest")},
            "entrypoint": rollout.get("entrypoint"),
            "model_path": inputs.get("model_path"),
            "dataset": {
                "name": info.get("dataset_name"),
                "sha256": dataset.get("sha256"),
                "selected_source_rows": dataset.get("selected_source_rows"),
            },
        },
        "evaluation_config": {"n": inputs.get("n"), "pass_threshold": pass_threshold(path)},
    }


def check(path: Path) -> list[str]:
    """Every reason an official run directory is not a finished run that may be uploaded
    (the official `eval upload`'s own checks, in short); empty: it may."""
    problems: list[str] = []
    manifest, metrics = _obj(_json(path / "manifest.json")), _obj(_json(path / "metrics.json"))
    if manifest.get("run_name") != path.name:
        problems.append(
            f"manifest.json: run_name {manifest.get('run_name')!r} is not the directory's "
            f"name {path.name!r}"
        )
    info = _obj(metrics.get("eval_run"))
    if info.get("status") != "finished":
        problems.append(
            f"metrics.json: eval_run.status is {info.get('status')!r}; only a finished run "
            "is uploaded"
        )
    total = _obj(_json(path / "progress.json")).get("total_runs")
    found = len(records(path))
    if not isinstance(total, int) or found != total:
        problems.append(
            f"index.jsonl holds {found} valid attempt(s) but progress.json says total_runs "
            f"{total!r}: the run is not complete"
        )
    links = [
        (Path(d) / n).relative_to(path).as_posix()
        for d, dirs, names in os.walk(path)
        for n in (*dirs, *names)
        if (Path(d) / n).is_symlink()
    ]
    if links:
        problems.append(f"symbolic links are not uploaded: {', '.join(sorted(links)[:5])}")
    return problems


# -- our run directory, readable by the official `eval upload` -------------------------------
def atif_conformant(document: Mapping[str, Any]) -> Mapping[str, Any]:
    """`document` with the keys ATIF does not define moved into `extra` (the official client
    validates trajectories strictly); `document` itself when there are none, as in what the
    engine writes (`classify.enrich_trajectory` writes them conformant)."""
    steps = document.get("steps")
    fixed_steps = steps
    if isinstance(steps, list):
        fixed = [
            {**step, "metrics": metrics}
            if isinstance(step, Mapping)
            and "metrics" in step
            and (metrics := conformant_metrics(step["metrics"], ATIF_STEP_METRICS))
            is not step["metrics"]
            else step
            for step in steps
        ]
        if any(new is not old for new, old in zip(fixed, steps, strict=True)):
            fixed_steps = fixed
    final = document.get("final_metrics")
    fixed_final = conformant_metrics(final, ATIF_FINAL_METRICS) if final is not None else None
    if fixed_steps is steps and fixed_final is final:
        return document
    changed = dict(document)
    if fixed_steps is not steps:
        changed["steps"] = fixed_steps
    if fixed_final is not final:
        changed["final_metrics"] = fixed_final
    return changed


def mirror_trial(
    run_dir: Path,
    record: AttemptRecord,
    *,
    trajectory: Path,
    document: Mapping[str, Any] | None,
    artifacts: Path | None,
) -> None:
    """Fill `rollout_trials/<rollout_id>/` of our run directory as the official layout has it,
    from the files the run keeps (`trajectories/row_r_run_k.json`, `artifacts/row_r_run_k/`),
    so the official `eval upload` accepts the directory: the trajectory under its
    `trajectory_filename` (a copy only when ATIF needs keys moved, else a hard link), and the
    artifacts as hard links to our redacted copies, in place of what the rollout wrote.
    `document` is the trajectory as written at `trajectory` (None: the attempt has none)."""
    trial = run_dir / "rollout_trials" / record.rollout_id
    if trial.is_symlink():
        return  # never write through a link the rollout left
    trial.mkdir(parents=True, exist_ok=True)
    name = record.trajectory_filename
    if document is not None and name and _TRAJECTORY.fullmatch(name):
        target = trial / name
        fixed = atif_conformant(document)
        # The common case is one link and no document written: the engine writes its
        # trajectories conformant, and the rollout left nothing at `target`.
        if fixed is not document or not _linked(trajectory, target):
            partial = trial / f".{name}.partial"
            partial.unlink(missing_ok=True)
            if fixed is not document:
                partial.write_text(json.dumps(fixed, default=str), encoding="utf-8")
            else:
                _link(trajectory, partial)
            os.replace(partial, target)
    if artifacts is not None and artifacts.is_dir():
        mirrored = trial / "artifacts"
        if mirrored.is_symlink() or mirrored.is_file():
            mirrored.unlink()
        shutil.rmtree(mirrored, ignore_errors=True)
        for file in _walk(artifacts):
            if file.is_file() and not file.is_symlink():
                _link(file, mirrored / file.relative_to(artifacts))


def _linked(source: Path, destination: Path) -> bool:
    """Hard-link `source` at `destination` when nothing is there yet; False when something is
    (what the rollout wrote: replaced through a temporary name) or links are refused."""
    try:
        os.link(source, destination)
    except OSError:
        return False
    return True


# -- into our layout ---------------------------------------------------------------------------
def _link(source: Path, destination: Path) -> None:
    destination.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, destination)
    except OSError:
        shutil.copyfile(source, destination)


def _number(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def convert(
    source: Path,
    target: Path,
    *,
    run: Mapping[str, Any],
    local_run_id: str,
    provenance: Mapping[str, Any],
    schema_versions: Mapping[str, Any],
) -> None:
    """Write our run directory at `target` from an uploaded official layout at `source`.

    `run` is the upload's description of the run (name, times, experiment and evaluation
    config); files are hard-linked where the file system allows. The metrics are computed
    here from the index, never taken from the client.
    """
    experiment, evaluation = _obj(run.get("experiment_config")), _obj(run.get("evaluation_config"))
    rollout, dataset = _obj(experiment.get("rollout")), _obj(experiment.get("dataset"))
    threshold = _number(evaluation.get("pass_threshold"))
    threshold = DEFAULT_PASS_THRESHOLD if threshold is None else threshold
    name = str(run.get("name") or "")
    attempts = records(source)
    target.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, Any] = {
        "schema_version": 1,
        "local_run_id": local_run_id,
        "run_name": name,
        "created_at": run.get("started_at"),
        "inputs": {
            "model_path": experiment.get("model_path"),
            "dataset": {
                "sha256": dataset.get("sha256"),
                "selected_source_rows": dataset.get("selected_source_rows"),
            },
            "n": evaluation.get("n"),
            "pass_threshold": threshold,
            "rollout": {
                "name": rollout.get("name"),
                "entrypoint": experiment.get("entrypoint"),
                "source_digest": rollout.get("source_digest"),
            },
            "env": {},
            "secrets": [],
            "timeouts": {},
            "versions": dict(schema_versions),
        },
        "provenance": {
            **provenance,
            "config_branch": rollout.get("branch"),
            "config_commit_sha": rollout.get("commit_sha"),
            "layout": "osmosis-ai",
        },
    }
    (target / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    with (target / "events.jsonl").open("w", encoding="utf-8") as journal:
        for record in attempts:
            journal.write(json.dumps(journal_entry(record)) + "\n")
    index = "".join(json.dumps(index_row(record)) + "\n" for record in attempts)
    (target / "index.jsonl").write_text(index, encoding="utf-8")
    (target / "summary.jsonl").write_text(index, encoding="utf-8")
    for name_ in ("progress.json", "logs.txt"):
        if (source / name_).is_file():
            _link(source / name_, target / name_)
    started, completed = run.get("started_at"), run.get("completed_at")
    duration = None
    with contextlib.suppress(ValueError):
        duration = (
            datetime.fromisoformat(str(completed)) - datetime.fromisoformat(str(started))
        ).total_seconds() * 1000
    metrics = {
        "eval_run": {
            "id": local_run_id,
            "status": "finished",
            "name": name,
            "dataset_name": dataset.get("name"),
            "model_name": experiment.get("model_path"),
            "rollout_name": rollout.get("name"),
            "duration_ms": duration,
            "started_at": started,
            "completed_at": completed,
        },
        "summary": summarize(attempts, threshold),
    }
    (target / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    for record in attempts:
        slot = f"row_{record.row_index}_run_{record.run_index}"
        trial = source / "rollout_trials" / record.rollout_id
        if record.trajectory_filename and (trial / record.trajectory_filename).is_file():
            _link(trial / record.trajectory_filename, target / "trajectories" / f"{slot}.json")
        for file in _walk(trial / "artifacts"):
            relative = file.relative_to(trial / "artifacts")
            if file.is_file() and not file.is_symlink():
                _link(file, target / "artifacts" / slot / relative)
