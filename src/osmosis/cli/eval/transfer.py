"""The transfer engine of `osmosis eval download`: a server manifest to verified local files.

    plan = plan_transfer(manifest.files, run_dir, selected_types=("metrics",), overwrite=False)
    result = transfer(plan, lambda path, dest: client.runs.download_file(run, path, dest))

Rules (reference §7.8):

* every manifest path is checked here too, whatever the server says: only the fixed layout
  (`metrics.json`, `summary.jsonl`, `trajectories/row_<r>_run_<k>.json`,
  `artifacts/row_<r>_run_<k>/...`, `logs.txt`) of the selected types, no absolute paths, `..`,
  backslashes, duplicates, or the reserved `artifacts/row_*_run_*/manifest.json`;
* a local file whose size and sha256 both match is skipped (unless `overwrite`);
* up to 8 files at once, each into `<name>.partial`, verified (size and sha256), then renamed
  over the final name in one step, so a final name never holds half a file;
* each file is retried up to 3 times with exponential backoff; one failure never stops the
  others, and a rerun fetches only what is still missing or different.

The fetch function is injected, so the engine runs (and is tested) without a server.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from osmosis.eval.inputs.dataset_formats import sha256_file

__all__ = [
    "CONCURRENCY",
    "CONFIRM_BYTES",
    "DEFAULT_TYPES",
    "RETRIES",
    "TYPES",
    "FetchError",
    "ManifestEntry",
    "RemoteFile",
    "TransferPlan",
    "TransferResult",
    "parse_types",
    "path_category",
    "plan_transfer",
    "run_dir_name",
    "transfer",
]

TYPES = ("metrics", "trajectories", "artifacts", "logs")
DEFAULT_TYPES = ("metrics", "trajectories")
CONFIRM_BYTES = 100 * 1024 * 1024  # remaining bytes above this need a confirmation
CONCURRENCY = 8
RETRIES = 3  # retries after the first attempt of each file
PARTIAL_SUFFIX = ".partial"
# Files a running run only appends to: a longer copy than the manifest's is cut to its size.
_APPEND_ONLY = frozenset({"logs.txt"})

_TRAJECTORY = re.compile(r"^trajectories/row_\d+_run_\d+\.json$")
_ARTIFACT = re.compile(r"^artifacts/row_\d+_run_\d+/.+$")
_RESERVED = re.compile(r"^artifacts/row_\d+_run_\d+/manifest\.json$")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

# (path, dest) -> anything: write the file's bytes to `dest`; raise on failure.
Fetch = Callable[[str, Path], object]


class ManifestEntry(Protocol):
    """One file of a server manifest (the platform's `RunFile` has these fields)."""

    @property
    def path(self) -> str: ...
    @property
    def size(self) -> int: ...
    @property
    def sha256(self) -> str: ...
    @property
    def type(self) -> str: ...


@dataclass(frozen=True)
class RemoteFile:
    """A manifest entry built by hand (tests, callers without the wire models)."""

    path: str
    size: int
    sha256: str
    type: str


class FetchError(Exception):
    """A file that did not arrive intact; `retryable=False` stops its retries at once."""

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


# -- selection ------------------------------------------------------------------------------
def parse_types(value: str | None) -> tuple[str, ...]:
    """`--type`: a comma list of `TYPES`, or `all` alone; None gives the default.

    Raises `ValueError` naming every unknown value and what is valid.
    """
    if value is None:
        return DEFAULT_TYPES
    requested = [part.strip().lower() for part in value.split(",")]
    if not requested or any(not part for part in requested):
        raise ValueError(f"--type must be a comma-separated list of {', '.join(TYPES)} or all")
    if requested == ["all"]:
        return TYPES
    # Every problem at once: an unknown word and a misplaced `all` are both reported.
    problems = []
    unknown = [part for part in requested if part not in (*TYPES, "all")]
    if unknown:
        problems.append(f"unknown --type value(s): {', '.join(unknown)}")
    if "all" in requested:
        problems.append("--type all cannot be combined with other types")
    if problems:
        raise ValueError(f"{'; '.join(problems)}; choose from {', '.join(TYPES)}, or all alone")
    return tuple(dict.fromkeys(requested))


def path_category(path: str) -> str | None:
    """The download type a layout path belongs to, or None when it is outside the layout."""
    if path == "metrics.json":
        return "metrics"
    if path == "logs.txt":
        return "logs"
    if path == "summary.jsonl" or _TRAJECTORY.match(path):
        return "trajectories"
    if _ARTIFACT.match(path) and not _RESERVED.match(path):
        return "artifacts"
    return None


def run_dir_name(name: str | None, run_id: str) -> str:
    """The local directory of a run: its name when safe as a file name, else a sanitised
    name plus `--<run id>` (so two runs never share a directory), or the id alone.

        run_dir_name("smoke-brave-otter-1a2b", "f00d...")  # 'smoke-brave-otter-1a2b'
        run_dir_name("a/b", "f00d")                         # 'a-b--f00d'

    Both come from the server, so the result is always one plain file name: an id that is
    not one (`/etc`, `..`, `a/b`) is refused with a `CLIError`, never joined to a path.
    """
    if _safe_component(name):
        assert name is not None
        return name
    if not _safe_component(run_id):
        from osmosis.cli.output import CLIError

        shown = run_id if len(run_id) <= 80 else run_id[:77] + "..."
        raise CLIError(
            f"the platform answered run id {shown!r} and run name {(name or '')[:80]!r}, "
            "neither of which is a plain file name; refusing to write outside the output "
            "directory",
            code="PLATFORM_ERROR",
            details={"run_id": shown, "name": (name or "")[:80]},
            hint="is --platform (or OSMOSIS_PLATFORM_URL) the server you meant?",
        )
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", name or "").strip(".-")[:80]
    return f"{cleaned}--{run_id}" if cleaned else run_id


def _safe_component(value: str | None) -> bool:
    return bool(value and _SAFE_NAME.fullmatch(value) and not value.endswith(PARTIAL_SUFFIX))


# -- planning -------------------------------------------------------------------------------
@dataclass
class TransferPlan:
    """What to fetch into `run_dir`, what is already there, and what the manifest got wrong."""

    run_dir: Path
    files: list[ManifestEntry]  # every accepted entry
    to_fetch: list[ManifestEntry]
    skipped: list[ManifestEntry]
    rejected: list[dict[str, str]]  # {path, error}

    @property
    def total_bytes(self) -> int:
        return sum(item.size for item in self.files)

    @property
    def remaining_bytes(self) -> int:
        return sum(item.size for item in self.to_fetch)

    def breakdown(self) -> dict[str, dict[str, int]]:
        """Files and bytes per type, over every accepted entry."""
        result: dict[str, dict[str, int]] = {}
        for item in self.files:
            bucket = result.setdefault(item.type, {"files": 0, "bytes": 0})
            bucket["files"] += 1
            bucket["bytes"] += item.size
        return result


def _path_problem(path: str, file_type: str, selected: Iterable[str]) -> str | None:
    if not path or path.startswith("/") or re.match(r"^[A-Za-z]:", path):
        return "absolute or empty path"
    if "\\" in path:
        return "backslash in path"
    if any(part in ("", ".", "..") for part in path.split("/")):
        return "'.', '..' or empty segment in path"
    if "\0" in path or path.endswith(PARTIAL_SUFFIX):
        return "reserved name"
    category = path_category(path)
    if category is None:
        return "outside the fixed run layout (or a reserved artifacts manifest.json)"
    if category != file_type:
        return f"listed as {file_type!r}, but the path is a {category!r} file"
    if category not in selected:
        return f"type {category!r} was not requested"
    return None


def plan_transfer(
    files: Sequence[ManifestEntry],
    run_dir: Path,
    *,
    selected_types: Sequence[str],
    overwrite: bool = False,
) -> TransferPlan:
    """Check every manifest entry and compare the accepted ones with what `run_dir` holds."""
    accepted: list[ManifestEntry] = []
    rejected: list[dict[str, str]] = []
    seen: set[str] = set()
    directories: set[str] = set()
    root = run_dir.resolve()
    for item in files:
        problem = _path_problem(item.path, item.type, selected_types)
        parents = {
            "/".join(item.path.split("/")[:end]) for end in range(1, item.path.count("/") + 1)
        }
        if problem is None and item.path in seen:
            problem = "duplicate path in the manifest"
        elif problem is None and (item.path in directories or parents & seen):
            problem = "a file and a directory of the same name in the manifest"
        elif problem is None and not (run_dir / item.path).resolve().is_relative_to(root):
            problem = "leads outside the run directory through a local symlink"
        elif problem is None and (item.size < 0 or not re.fullmatch(r"[0-9a-f]{64}", item.sha256)):
            problem = "invalid size or sha256 in the manifest"
        if problem is not None:
            rejected.append({"path": item.path, "error": f"rejected: {problem}"})
            continue
        seen.add(item.path)
        directories |= parents
        accepted.append(item)
    to_fetch = [f for f in accepted if overwrite or not _matches(run_dir / f.path, f)]
    fetching = {id(f) for f in to_fetch}
    skipped = [f for f in accepted if id(f) not in fetching]
    return TransferPlan(run_dir, accepted, to_fetch, skipped, rejected)


def _matches(path: Path, item: ManifestEntry) -> bool:
    """Size first (cheap), then the sha256: a same-size edit is still re-fetched."""
    try:
        return (
            path.is_file() and path.stat().st_size == item.size and sha256_file(path) == item.sha256
        )
    except OSError:
        return False


# -- transfer -------------------------------------------------------------------------------
@dataclass
class TransferResult:
    downloaded: list[str] = field(default_factory=list)
    failed: list[dict[str, str]] = field(default_factory=list)  # {path, error}
    bytes_downloaded: int = 0


def _retryable(error: BaseException) -> bool:
    return not isinstance(error, FetchError) or error.retryable


def _fetch_verified(item: ManifestEntry, run_dir: Path, fetch: Fetch, stop: threading.Event) -> int:
    final = run_dir / item.path
    partial = final.with_name(final.name + PARTIAL_SUFFIX)
    if stop.is_set():
        raise FetchError("cancelled", retryable=False)
    try:
        partial.parent.mkdir(parents=True, exist_ok=True)
        fetch(item.path, partial)
        size = partial.stat().st_size
        if size > item.size and item.path in _APPEND_ONLY:
            # A running run's log grew since the manifest: its first bytes are what was listed.
            with partial.open("r+b") as handle:
                handle.truncate(item.size)
            size = item.size
        if size != item.size:
            raise FetchError(f"received {size} bytes, the manifest says {item.size}")
        if sha256_file(partial) != item.sha256:
            raise FetchError("sha256 of the received bytes differs from the manifest")
        os.replace(partial, final)  # atomic: the final name holds the old file or the new one
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return size


def transfer(
    plan: TransferPlan,
    fetch: Fetch,
    *,
    concurrency: int = CONCURRENCY,
    retries: int = RETRIES,
    backoff: float = 0.5,
    on_file: Callable[[ManifestEntry, bool], None] | None = None,
) -> TransferResult:
    """Fetch `plan.to_fetch` into `plan.run_dir`; never raises for a single file's failure.

    `backoff` is the first retry's wait in seconds (doubling after); `on_file(entry, ok)` is
    called as each file ends, from the worker threads.
    """
    result = TransferResult(failed=list(plan.rejected))
    lock = threading.Lock()
    stop = threading.Event()

    def one(item: ManifestEntry) -> int:
        retrying = Retrying(
            stop=stop_after_attempt(retries + 1),
            wait=wait_exponential(multiplier=backoff, max=max(backoff * 8, 0.0)),
            retry=retry_if_exception(lambda e: _retryable(e) and not stop.is_set()),
            reraise=True,
        )
        size: int = retrying(_fetch_verified, item, plan.run_dir, fetch, stop)
        return size

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        futures = {pool.submit(one, item): item for item in plan.to_fetch}
        try:
            for future in as_completed(futures):
                item = futures[future]
                error = future.exception()
                with lock:
                    if error is None:
                        result.downloaded.append(item.path)
                        result.bytes_downloaded += future.result()
                    else:
                        result.failed.append({"path": item.path, "error": _describe(error)})
                if on_file is not None:
                    on_file(item, error is None)
        except BaseException:  # Ctrl-C: let running files clean their .partial, start no more
            stop.set()
            for future in futures:
                future.cancel()
            raise
    result.downloaded.sort()
    result.failed.sort(key=lambda failure: failure["path"])
    return result


def _describe(error: BaseException) -> str:
    message = getattr(error, "message", None) or str(error) or type(error).__name__
    return str(message)
