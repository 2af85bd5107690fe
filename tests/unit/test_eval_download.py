"""The `eval download` transfer engine, with an injected fetch function instead of a server."""

from __future__ import annotations

import hashlib
import threading
from collections import Counter
from pathlib import Path

import pytest

from osmosis.cli.eval.transfer import (
    DEFAULT_TYPES,
    TYPES,
    FetchError,
    RemoteFile,
    parse_types,
    plan_transfer,
    run_dir_name,
    transfer,
)

SERVER = {
    "metrics.json": b'{"summary": {"pass_rate": 0.5}}',
    "summary.jsonl": b'{"row_index": 0}\n{"row_index": 1}\n',
    "trajectories/row_0_run_0.json": b'{"steps": [1]}',
    "trajectories/row_1_run_0.json": b'{"steps": [2, 3]}',
    "artifacts/row_0_run_0/out/answer.txt": b"42\n",
    "logs.txt": b"started\nfinished\n",
}
TYPE_OF = {
    "metrics.json": "metrics",
    "summary.jsonl": "trajectories",
    "logs.txt": "logs",
}


def entry(path: str, data: bytes | None = None, type_: str | None = None) -> RemoteFile:
    data = SERVER[path] if data is None else data
    kind = type_ or TYPE_OF.get(path) or path.split("/")[0]
    return RemoteFile(path, len(data), hashlib.sha256(data).hexdigest(), kind)


MANIFEST = [entry(path) for path in SERVER]


class Server:
    """Serves `SERVER`; `fail[path] = n` makes the next n fetches of `path` fail."""

    def __init__(self, fail: dict[str, int] | None = None, corrupt: set[str] = frozenset()):
        self.fail = dict(fail or {})
        self.corrupt = corrupt
        self.calls: Counter[str] = Counter()
        self.lock = threading.Lock()

    def __call__(self, path: str, dest: Path) -> int:
        with self.lock:
            self.calls[path] += 1
            failing = self.fail.get(path, 0) > 0
            if failing:
                self.fail[path] -= 1
        data = SERVER[path]
        if failing:
            dest.write_bytes(data[: len(data) // 2])  # half a file, then the connection drops
            raise FetchError("connection reset")
        dest.write_bytes(b"X" + data[1:] if path in self.corrupt else data)
        return len(data)


def tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_everything_arrives_verified_and_a_rerun_transfers_nothing(tmp_path):
    run_dir = tmp_path / "run"
    plan = plan_transfer(MANIFEST, run_dir, selected_types=TYPES)
    assert len(plan.to_fetch) == 6 and plan.remaining_bytes == sum(map(len, SERVER.values()))
    server = Server()
    result = transfer(plan, server, backoff=0)
    assert result.failed == [] and sorted(result.downloaded) == sorted(SERVER)
    assert result.bytes_downloaded == plan.total_bytes
    assert tree(run_dir) == SERVER
    assert plan.breakdown()["trajectories"] == {
        "files": 3,
        "bytes": sum(
            len(SERVER[p]) for p in SERVER if TYPE_OF.get(p, p.split("/")[0]) == "trajectories"
        ),
    }

    again = plan_transfer(MANIFEST, run_dir, selected_types=TYPES)
    assert again.to_fetch == [] and len(again.skipped) == 6
    assert transfer(again, server, backoff=0).downloaded == []
    assert sum(server.calls.values()) == 6


def test_a_log_that_grew_after_the_manifest_arrives_as_listed_not_failed(tmp_path):
    # While a run runs, logs.txt gains lines between the manifest and the fetch; other files
    # that arrive longer than listed are still refused.
    listed = b"line 1\nline 2\n"
    manifest = [entry("logs.txt", listed), entry("metrics.json", b"{}")]

    def growing(path: str, dest: Path) -> None:
        dest.write_bytes(listed + b"line 3\n" if path == "logs.txt" else b"{} ")

    plan = plan_transfer(manifest, tmp_path / "run", selected_types=TYPES)
    result = transfer(plan, growing, backoff=0)
    assert result.downloaded == ["logs.txt"]
    assert (tmp_path / "run" / "logs.txt").read_bytes() == listed
    assert [f["path"] for f in result.failed] == ["metrics.json"]
    assert "manifest says 2" in result.failed[0]["error"]


def test_a_local_file_whose_content_differs_is_fetched_again_even_at_the_same_size(tmp_path):
    run_dir = tmp_path / "run"
    transfer(plan_transfer(MANIFEST, run_dir, selected_types=TYPES), Server(), backoff=0)
    edited = run_dir / "metrics.json"
    edited.write_bytes(b"{" + SERVER["metrics.json"][1:-1] + b" ")  # same size, other bytes
    shorter = run_dir / "logs.txt"
    shorter.write_bytes(b"started\n")

    plan = plan_transfer(MANIFEST, run_dir, selected_types=TYPES)
    assert sorted(f.path for f in plan.to_fetch) == ["logs.txt", "metrics.json"]
    transfer(plan, Server(), backoff=0)
    assert tree(run_dir) == SERVER

    forced = plan_transfer(MANIFEST, run_dir, selected_types=TYPES, overwrite=True)
    assert len(forced.to_fetch) == 6 and forced.skipped == []


def test_failures_give_a_partial_result_and_a_rerun_fetches_only_what_is_missing(tmp_path):
    run_dir = tmp_path / "run"
    # logs.txt fails on every attempt (1 + 3 retries); summary.jsonl recovers on its 3rd try.
    server = Server(fail={"logs.txt": 99, "summary.jsonl": 2}, corrupt={"metrics.json"})
    result = transfer(plan_transfer(MANIFEST, run_dir, selected_types=TYPES), server, backoff=0)
    assert [f["path"] for f in result.failed] == ["logs.txt", "metrics.json"]
    assert "connection reset" in result.failed[0]["error"]
    assert "sha256" in result.failed[1]["error"]
    assert server.calls["logs.txt"] == 4 and server.calls["summary.jsonl"] == 3
    assert server.calls["metrics.json"] == 4
    assert set(tree(run_dir)) == set(SERVER) - {"logs.txt", "metrics.json"}  # no .partial left

    healthy = Server()
    plan = plan_transfer(MANIFEST, run_dir, selected_types=TYPES)
    assert sorted(f.path for f in plan.to_fetch) == ["logs.txt", "metrics.json"]
    rerun = transfer(plan, healthy, backoff=0)
    assert rerun.failed == [] and sorted(healthy.calls) == ["logs.txt", "metrics.json"]
    assert tree(run_dir) == SERVER


def test_a_file_not_retryable_fails_at_once(tmp_path):
    calls = Counter()

    def gone(path: str, dest: Path) -> None:
        calls[path] += 1
        raise FetchError("404 not found", retryable=False)

    plan = plan_transfer([entry("metrics.json")], tmp_path, selected_types=TYPES)
    result = transfer(plan, gone, backoff=0)
    assert result.failed == [{"path": "metrics.json", "error": "404 not found"}]
    assert calls["metrics.json"] == 1


def test_the_final_name_never_holds_half_a_file(tmp_path):
    run_dir = tmp_path / "run"
    final = run_dir / "trajectories" / "row_0_run_0.json"
    final.parent.mkdir(parents=True)
    final.write_bytes(b"old complete version")
    seen_during_fetch = []

    def slow(path: str, dest: Path) -> None:
        dest.write_bytes(SERVER[path][:5])
        # Mid-transfer: the bytes go to the .partial sibling, the final name is untouched.
        seen_during_fetch.append((dest.name, final.read_bytes()))
        raise OSError("disk unplugged")

    plan = plan_transfer([entry("trajectories/row_0_run_0.json")], run_dir, selected_types=TYPES)
    result = transfer(plan, slow, retries=1, backoff=0)
    assert seen_during_fetch == [("row_0_run_0.json.partial", b"old complete version")] * 2
    assert result.failed[0]["error"] == "disk unplugged"
    assert tree(run_dir) == {"trajectories/row_0_run_0.json": b"old complete version"}


BAD_PATHS = [
    ("/etc/passwd", "metrics", "absolute"),
    ("C:/x/metrics.json", "metrics", "absolute"),
    ("../metrics.json", "metrics", "'..'"),
    ("trajectories/../../x.json", "trajectories", "'..'"),
    ("trajectories\\row_0_run_0.json", "trajectories", "backslash"),
    ("artifacts/row_0_run_0/manifest.json", "artifacts", "outside the fixed run layout"),
    ("artifacts/row_0_run_0//a", "artifacts", "empty segment"),
    ("notes.txt", "logs", "outside the fixed run layout"),
    ("trajectories/anything.json", "trajectories", "outside the fixed run layout"),
    ("artifacts/row_0_run_0", "artifacts", "outside the fixed run layout"),
    ("logs.txt", "metrics", "listed as 'metrics'"),
]


@pytest.mark.parametrize(("path", "kind", "why"), BAD_PATHS)
def test_paths_outside_the_layout_are_rejected_and_never_written(tmp_path, path, kind, why):
    run_dir = tmp_path / "a" / "run"
    bad = RemoteFile(path, 3, hashlib.sha256(b"bad").hexdigest(), kind)
    plan = plan_transfer([bad, entry("metrics.json")], run_dir, selected_types=TYPES)
    assert [f.path for f in plan.files] == ["metrics.json"]
    assert plan.rejected[0]["path"] == path and why in plan.rejected[0]["error"]

    def fetch(p: str, dest: Path) -> None:
        dest.write_bytes(SERVER.get(p, b"bad"))

    result = transfer(plan, fetch, backoff=0)
    assert result.downloaded == ["metrics.json"] and result.failed == plan.rejected
    assert [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()] == [
        "a/run/metrics.json"
    ]


def test_duplicates_conflicts_unselected_types_and_symlinks_are_rejected(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "artifacts").mkdir(parents=True)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (run_dir / "artifacts" / "row_9_run_0").symlink_to(outside)
    files = [
        entry("metrics.json"),
        entry("metrics.json"),
        entry("artifacts/row_0_run_0/out/answer.txt"),
        entry("artifacts/row_0_run_0/out", b"file where a directory is"),
        entry("artifacts/row_9_run_0/escape.txt", b"x"),
        entry("logs.txt"),
    ]
    plan = plan_transfer(files, run_dir, selected_types=("metrics", "artifacts"))
    assert [f.path for f in plan.files] == ["metrics.json", "artifacts/row_0_run_0/out/answer.txt"]
    errors = {r["path"]: r["error"] for r in plan.rejected}
    assert "duplicate" in errors["metrics.json"]
    assert "a file and a directory" in errors["artifacts/row_0_run_0/out"]
    assert "symlink" in errors["artifacts/row_9_run_0/escape.txt"]
    assert "not requested" in errors["logs.txt"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, DEFAULT_TYPES),
        ("artifacts", ("artifacts",)),
        ("logs, metrics,logs", ("logs", "metrics")),
        ("all", TYPES),
    ],
)
def test_type_selection_replaces_the_default(value, expected):
    assert parse_types(value) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("all,logs", "--type all cannot be combined"),
        ("metric,trajs", "unknown --type value(s): metric, trajs; choose from metrics"),
        # both problems at once
        ("bogus,all", "unknown --type value(s): bogus; --type all cannot be combined"),
        ("metrics,", "comma-separated"),
    ],
)
def test_bad_type_selections_name_what_is_valid(value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_types(value)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("smoke-brave-otter-1a2b", "smoke-brave-otter-1a2b"),
        ("a/b c", "a-b-c--abc123"),
        ("../..", "abc123"),
        (None, "abc123"),
        (".hidden", "hidden--abc123"),
    ],
)
def test_run_directory_names_are_safe_and_stable(name, expected):
    assert run_dir_name(name, "abc123") == expected


@pytest.mark.parametrize("run_id", ["/tmp/elsewhere", "..", ".", "a/b", "../up", "ok\n", ""])
@pytest.mark.parametrize("name", ["///", None, "../.."])
def test_an_id_from_the_server_that_is_not_a_plain_name_is_refused(name, run_id):
    # A name that cleans to nothing falls back to the id: that id must not be a path.
    from osmosis.cli.output import CLIError

    with pytest.raises(CLIError) as caught:
        run_dir_name(name, run_id)
    assert caught.value.code == "PLATFORM_ERROR"
    assert "refusing to write outside the output directory" in caught.value.message
