"""Finding and reading local run directories (`.osmosis/evals/<name>/`) for the commands that
look at finished or running local runs: `eval compare`, `eval info`, `eval upload`.

    found = find_local_run("try1", root=runs_root(None))    # a directory, or a name under root
    run = read_local_run(found)
    run.manifest["local_run_id"], len(run.records())

A directory the official osmosis-ai `eval run` wrote reads the same way: its attempts come
from its `index.jsonl` and its threshold from its `metrics.json`
(`osmosis.eval.results.official_layout`). So does a platform run fetched with
`eval download` (no manifest: its status, metrics and attempts are the platform's, from its
`metrics.json` and `summary.jsonl`); `read_local_run` reads it, `find_local_run` never
returns it (it is no run to upload or resume).

Reading never takes the run's lock: a run still being written is read as it stands (the
journal's last, unfinished line is ignored, as a resume would ignore it).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from osmosis.eval.results import official_layout
from osmosis.eval.results.records import AttemptRecord
from osmosis.vocabulary import DEFAULT_PASS_THRESHOLD


@dataclass(frozen=True)
class LocalRun:
    """One local run directory, as written by `eval run`."""

    path: Path
    manifest: dict[str, Any]
    metrics: dict[str, Any] | None
    """`metrics.json`, or None before the run first finished or halted."""
    downloaded: bool = False
    """A platform run as `eval download` wrote it: no manifest (`manifest` is empty)."""

    @property
    def eval_run(self) -> dict[str, Any]:
        value = (self.metrics or {}).get("eval_run")
        return value if isinstance(value, dict) else {}

    @property
    def name(self) -> str:
        return str(self.manifest.get("run_name") or self.eval_run.get("name") or self.path.name)

    @property
    def inputs(self) -> dict[str, Any]:
        inputs = self.manifest.get("inputs")
        return inputs if isinstance(inputs, dict) else {}

    @property
    def dataset_sha256(self) -> str | None:
        value = (self.inputs.get("dataset") or {}).get("sha256")
        return value if isinstance(value, str) else None

    @property
    def rows_digest(self) -> str | None:
        value = (self.inputs.get("dataset") or {}).get("selected_source_rows")
        if self.official:
            return official_layout.selection_digest(value)
        return value if isinstance(value, str) else None

    @property
    def official(self) -> bool:
        """Written by the official osmosis-ai CLI (no pass threshold in its manifest)."""
        return not self.downloaded and "pass_threshold" not in self.inputs

    @property
    def pass_threshold(self) -> float:
        if self.official or self.downloaded:  # both keep it in metrics.json only
            return official_layout.pass_threshold(self.path)
        value = self.inputs.get("pass_threshold")
        return float(value) if isinstance(value, int | float) else DEFAULT_PASS_THRESHOLD

    def records(self) -> list[AttemptRecord]:
        """Every recorded attempt, the latest journal line per (row, attempt), in row order."""
        if self.official:
            return official_layout.records(self.path)
        if self.downloaded:
            return official_layout.records(self.path, index=official_layout.DOWNLOAD_INDEX)
        latest: dict[tuple[int, int], AttemptRecord] = {}
        try:
            handle = (self.path / "events.jsonl").open("rb")
        except FileNotFoundError:
            return []
        with handle:
            for line in handle:
                if not line.endswith(b"\n"):
                    break  # being written, or cut short by a crash: not recorded yet
                with contextlib.suppress(ValueError):
                    record = AttemptRecord.model_validate_json(line)
                    latest[(record.row_index, record.run_index)] = record
        return [latest[key] for key in sorted(latest)]


def is_run_dir(path: Path) -> bool:
    return (path / "manifest.json").is_file()


def find_local_run(ref: str, *, root: Path) -> Path | None:
    """`ref` as a run directory (a path holding manifest.json), else as a run name under
    `root`; None when it is neither (it may then be a platform run)."""
    as_path = Path(ref).expanduser()
    if is_run_dir(as_path):
        return as_path.resolve()
    if "/" not in ref and ref not in ("", ".", "..") and is_run_dir(root / ref):
        return (root / ref).resolve()
    return None


def read_local_run(path: Path) -> LocalRun:
    """Read a run directory's manifest and metrics (a downloaded platform run: its metrics);
    a bad manifest is a `ValueError`."""
    if official_layout.is_download_dir(path):
        return LocalRun(path=path, manifest={}, metrics=_metrics(path), downloaded=True)
    try:
        manifest = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ValueError(
            f"{path / 'manifest.json'}: not a readable run manifest ({error})"
        ) from None
    if not isinstance(manifest, dict):
        raise ValueError(f"{path / 'manifest.json'}: not a JSON object")
    return LocalRun(path=path, manifest=manifest, metrics=_metrics(path))


def _metrics(path: Path) -> dict[str, Any] | None:
    with contextlib.suppress(OSError, ValueError):
        loaded = json.loads((path / "metrics.json").read_text(encoding="utf-8"))
        return loaded if isinstance(loaded, dict) else None
    return None
