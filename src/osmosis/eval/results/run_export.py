"""A finished local run directory as an upload: which files travel, and the checks that a
run directory must pass before (client) and after (server) it travels.

    files = export_files(run_dir)                   # [ExportFile(path, size, sha256), ...]
    problems = verify_run_dir(run_dir, pass_threshold=1.0)   # [] when it may be imported

Files: `manifest.json`, `events.jsonl` (the journal the platform mirrors into its attempts
table), `index.jsonl`, `summary.jsonl`, `progress.json`, `metrics.json`, `logs.txt`,
`trajectories/row_<r>_run_<k>.json` and `artifacts/row_<r>_run_<k>/**` (an attempt's
top-level `manifest.json` excepted, as in the reference). `rollout_trials/` stays home: the
trajectories and artifacts above are its redacted copies.

The checks follow the reference's `eval upload`: manifest schema 1 with a 32-hex
`local_run_id` and the directory's name, an index with one row per work item, metrics that
say `finished` for this run and equal a recomputation from the index, trajectories that
belong to their index rows, and no symbolic link anywhere.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Final

from osmosis.eval.inputs.dataset_formats import sha256_file
from osmosis.eval.results.metrics import reference_summary, summarize
from osmosis.eval.results.records import AttemptRecord, lint_index_row
from osmosis.vocabulary import DEFAULT_PASS_THRESHOLD

__all__ = ["ExportFile", "export_files", "is_export_path", "verify_run_dir"]

TOP_LEVEL: Final = (
    "manifest.json",
    "events.jsonl",
    "index.jsonl",
    "summary.jsonl",
    "progress.json",
    "metrics.json",
    "logs.txt",
)
REQUIRED: Final = ("manifest.json", "events.jsonl", "index.jsonl", "progress.json", "metrics.json")
_SLOT = re.compile(r"^row_(\d+)_run_(\d+)$")
_LOCAL_RUN_ID = re.compile(r"^[0-9a-f]{32}$")
_MAX_PROBLEMS = 50


@dataclass(frozen=True, slots=True)
class ExportFile:
    path: str
    """POSIX path inside the run directory."""
    size: int
    sha256: str


def is_export_path(path: str) -> bool:
    """Whether `path` is one the upload layout allows (and so a server may write)."""
    pure = PurePosixPath(path)
    parts = pure.parts
    if not parts or "\\" in path or any(p in ("", ".", "..") for p in path.split("/")):
        return False
    # No control characters (a NUL ends a C string) and no name a file system refuses.
    if any(ord(c) < 32 or c == "\x7f" for c in path) or any(
        len(part.encode()) > 255 for part in parts
    ):
        return False
    if pure.is_absolute():
        return False
    if len(parts) == 1:
        return path in TOP_LEVEL
    if parts[0] == "trajectories":
        return len(parts) == 2 and parts[1].endswith(".json") and bool(_SLOT.match(pure.stem))
    if parts[0] == "artifacts" and len(parts) >= 3 and _SLOT.match(parts[1]):
        return not (len(parts) == 3 and parts[2] == "manifest.json")
    return False


def _walk(root: Path) -> Iterator[Path]:
    # os.walk never follows links; links are reported by verify_run_dir, not sent.
    for directory, dirs, names in os.walk(root):
        dirs.sort()
        for name in sorted(names):
            yield Path(directory) / name


def export_files(run_dir: Path) -> list[ExportFile]:
    """The files an upload sends, with their sizes and SHA-256, in a stable order."""
    files = []
    for name in TOP_LEVEL:
        path = run_dir / name
        if path.is_file() and not path.is_symlink():
            files.append(ExportFile(name, path.stat().st_size, sha256_file(path)))
    for folder in ("trajectories", "artifacts"):
        for path in _walk(run_dir / folder):
            relative = path.relative_to(run_dir).as_posix()
            if path.is_symlink() or not path.is_file() or not is_export_path(relative):
                continue
            files.append(ExportFile(relative, path.stat().st_size, sha256_file(path)))
    return files


def _mapping(value: object) -> Mapping[str, Any]:
    """`value` when it is a JSON object, else an empty one (its absence is reported)."""
    return value if isinstance(value, Mapping) else {}


def _json(path: Path, problems: list[str]) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        problems.append(f"{path.name}: missing")
    except (OSError, UnicodeDecodeError, ValueError) as error:
        problems.append(f"{path.name}: not valid JSON ({error})")
    return None


def _index(path: Path, problems: list[str]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        problems.append("index.jsonl: missing")
        return rows
    except (OSError, UnicodeDecodeError) as error:
        problems.append(f"index.jsonl: unreadable ({error})")
        return rows
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            problems.append(f"index.jsonl line {number}: not JSON")
            continue
        problems += [f"index.jsonl line {number}: {p}" for p in lint_index_row(row)]
        if isinstance(row, dict):
            rows.append(row)
    return rows


def verify_run_dir(
    run_dir: Path,
    *,
    expected_name: str | None = None,
    manifest_digest: str | None = None,
) -> list[str]:
    """Every reason `run_dir` is not a finished run that may be uploaded (empty: it may).

    `expected_name` is the run name the upload declared (default: the directory's name);
    `manifest_digest` the SHA-256 of manifest.json it declared.
    """
    problems: list[str] = []
    links = sorted(
        (Path(directory) / name).relative_to(run_dir).as_posix()
        for directory, dirs, names in os.walk(run_dir)  # never follows a link
        for name in (*dirs, *names)
        if (Path(directory) / name).is_symlink()
    )
    if links:
        problems.append(f"symbolic links are not uploaded: {', '.join(links[:5])}")
    for name in REQUIRED:
        if not (run_dir / name).is_file():
            problems.append(f"{name}: missing")
    if problems:
        return problems
    manifest = _json(run_dir / "manifest.json", problems)
    name = expected_name or run_dir.name
    local_run_id = None
    if isinstance(manifest, Mapping):
        if manifest.get("schema_version") != 1:
            problems.append(
                f"manifest.json: schema_version must be 1, got {manifest.get('schema_version')!r}"
            )
        local_run_id = manifest.get("local_run_id")
        if not (isinstance(local_run_id, str) and _LOCAL_RUN_ID.fullmatch(local_run_id)):
            problems.append("manifest.json: local_run_id must be 32 lowercase hex characters")
        if manifest.get("run_name") != name:
            problems.append(
                f"manifest.json: run_name {manifest.get('run_name')!r} is not the run's name "
                f"{name!r}"
            )
    elif manifest is not None:
        problems.append("manifest.json: not a JSON object")
    if manifest_digest is not None and sha256_file(run_dir / "manifest.json") != manifest_digest:
        problems.append("manifest.json: its sha256 is not the declared manifest_digest")
    progress = _json(run_dir / "progress.json", problems)
    metrics = _json(run_dir / "metrics.json", problems)
    rows = _index(run_dir / "index.jsonl", problems)
    total = progress.get("total_runs") if isinstance(progress, Mapping) else None
    if not isinstance(total, int):
        problems.append("progress.json: total_runs must be an integer")
    elif len(rows) != total:
        problems.append(
            f"index.jsonl has {len(rows)} rows but progress.json says total_runs {total}: "
            "the run is not complete (resume it, then upload)"
        )
    threshold = DEFAULT_PASS_THRESHOLD
    if isinstance(manifest, Mapping):
        value = _mapping(manifest.get("inputs")).get("pass_threshold")
        if isinstance(value, int | float) and not isinstance(value, bool):
            threshold = float(value)
        else:
            problems.append("manifest.json: inputs.pass_threshold must be a number")
    if isinstance(metrics, Mapping):
        run = _mapping(metrics.get("eval_run"))
        if run.get("status") != "finished":
            problems.append(
                f"metrics.json: eval_run.status is {run.get('status')!r}; only a finished run "
                "is uploaded"
            )
        if local_run_id is not None and run.get("id") != local_run_id:
            problems.append("metrics.json: eval_run.id is not the manifest's local_run_id")
        if run.get("name") != name:
            problems.append(f"metrics.json: eval_run.name {run.get('name')!r} is not {name!r}")
        summary = metrics.get("summary")
        if isinstance(summary, Mapping) and rows and not any("index.jsonl" in p for p in problems):
            recomputed = reference_summary(summarize(rows, threshold))
            if reference_summary(summary) != recomputed:
                problems.append(
                    "metrics.json: its summary does not match index.jsonl (recomputed); "
                    "the files are from different states of the run"
                )
        elif not isinstance(summary, Mapping):
            problems.append("metrics.json: summary missing")
    problems += _check_journal(run_dir / "events.jsonl", rows)
    problems += _check_trajectories(run_dir, rows)
    if len(problems) > _MAX_PROBLEMS:
        problems = [*problems[:_MAX_PROBLEMS], f"… and {len(problems) - _MAX_PROBLEMS} more"]
    return problems


def _check_journal(path: Path, rows: list[dict[str, Any]]) -> list[str]:
    """The journal (which the platform mirrors into its attempts) must say what the index says."""
    latest: dict[tuple[int, int], AttemptRecord] = {}
    bad = 0
    with path.open("rb") as handle:
        for line in handle:
            try:
                record = AttemptRecord.model_validate_json(line)
            except ValueError:
                bad += 1
                continue
            latest[(record.row_index, record.run_index)] = record
    problems = [f"events.jsonl: {bad} line(s) are not attempt records"] if bad else []
    indexed = {(r.get("row_index"), r.get("run_index")): r for r in rows}
    if set(indexed) != set(latest):
        problems.append("events.jsonl and index.jsonl do not hold the same attempts")
        return problems
    differ = [
        key
        for key, record in latest.items()
        if (record.rollout_id, record.status, record.reward)
        != (indexed[key].get("rollout_id"), indexed[key].get("status"), indexed[key].get("reward"))
    ]
    if differ:
        problems.append(
            f"events.jsonl and index.jsonl disagree on {len(differ)} attempt(s), e.g. row "
            f"{differ[0][0]} attempt {differ[0][1]}"
        )
    return problems


def _check_trajectories(run_dir: Path, rows: list[dict[str, Any]]) -> list[str]:
    problems = []
    by_slot = {(r.get("row_index"), r.get("run_index")): r for r in rows}
    folder = run_dir / "trajectories"
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        slot = _SLOT.match(path.stem)
        if slot is None:
            problems.append(f"trajectories/{path.name}: not named row_<r>_run_<k>.json")
            continue
        key = (int(slot.group(1)), int(slot.group(2)))
        row = by_slot.get(key)
        if row is None:
            problems.append(f"trajectories/{path.name}: no index row {key[0]} attempt {key[1]}")
            continue
        document = _json(path, problems)
        if not isinstance(document, Mapping):
            continue
        session = document.get("session_id")
        if session is not None and session != row.get("rollout_id"):
            problems.append(
                f"trajectories/{path.name}: session_id is not the index row's rollout_id"
            )
        extra = _mapping(
            _mapping(_mapping(document.get("extra")).get("osmosis")).get("request_extra_fields")
        )
        for field_name, expected in (("row_index", key[0]), ("run_index", key[1])):
            if field_name in extra and extra[field_name] != expected:
                problems.append(f"trajectories/{path.name}: {field_name} is {extra[field_name]}")
    return problems
