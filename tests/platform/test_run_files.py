"""A run directory as the API serves it (log pages, the download layout) and the checkout of a
run's commit: plain files and real git repositories, no server."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from osmosis.platform.core.errors import NotFound, ValidationFailed
from osmosis.platform.services.run_files import (
    append_log,
    file_manifest,
    file_type,
    layout_file,
    parse_rows,
    parse_types,
    read_logs,
    tail_logs,
)
from osmosis.platform.worker.checkout import CheckoutError, checkout, mirror_path
from tests.platform.eval_world import git


# -- logs -------------------------------------------------------------------------------------
def write_log(run: Path) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    (run / "logs.txt").write_text(
        "2026-12-01T10:00:00.000+00:00 run x: 4 of 4 work items pending\n"
        "2026-12-01T10:00:01.000+00:00 [rollout] Traceback (most recent call last):\n"
        '  File "main.py", line 3\n'
        "2026-12-01T10:00:02.000+00:00 halting dispatch: rollout server exited\n"
    )
    append_log(run, "commit abc is not in origin\npush it", level="error")
    return run / "logs.txt"


def test_log_pages_follow_the_cursor_and_keep_multiline_entries_whole(tmp_path):
    path = write_log(tmp_path / "run")
    first = read_logs(path, cursor=None, limit=2)
    kinds = [(e.step, e.level) for e in first.entries]
    assert kinds == [("engine", "info"), ("rollout", "error")]
    traceback = 'Traceback (most recent call last):\n  File "main.py", line 3'
    assert first.entries[1].message == traceback
    assert first.next_cursor is not None
    rest = read_logs(path, cursor=first.next_cursor, limit=50)
    kinds = [(e.step, e.level) for e in rest.entries]
    assert kinds == [("engine", "warning"), ("platform", "error")]
    assert rest.entries[1].message == "commit abc is not in origin\n  push it"
    assert rest.next_cursor is None  # nothing more written yet
    assert rest.entries[0].timestamp is not None and rest.entries[0].timestamp.year == 2026
    assert [e.message for e in tail_logs(path, count=1)] == [rest.entries[1].message]


@pytest.mark.parametrize(
    ("line", "level"),
    [
        ("ERROR:root:grader exploded", "error"),
        ("ERROR:    Exception in ASGI application", "error"),
        ("CRITICAL:worker:out of memory", "error"),
        ("WARNING:httpx:retrying", "warning"),
        ("INFO:     Uvicorn running on http://127.0.0.1:1", "info"),
        ("ERRORS are counted per type", "info"),
        ("computed 3 rewards", "info"),
    ],
)
def test_the_rollouts_own_lines_keep_their_level(tmp_path, line, level):
    run = tmp_path / "run"
    run.mkdir()
    (run / "logs.txt").write_text(f"2026-12-01T10:00:00.000+00:00 [rollout] {line}\n")
    [entry] = read_logs(run / "logs.txt", cursor=None, limit=5).entries
    assert (entry.step, entry.level, entry.message) == ("rollout", level, line)


def test_a_missing_log_is_empty_and_a_bad_cursor_names_the_fix(tmp_path):
    assert read_logs(tmp_path / "none.txt", cursor=None, limit=10).entries == []
    for cursor in ("abc", "9" * 5000, "²"):
        with pytest.raises(ValidationFailed, match="next_cursor"):
            read_logs(tmp_path / "none.txt", cursor=cursor, limit=10)


# -- the download layout ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("metrics.json", "metrics"),
        ("logs.txt", "logs"),
        ("summary.jsonl", "trajectories"),
        ("trajectories/row_3_run_0.json", "trajectories"),
        ("artifacts/row_3_run_0/out/a.txt", "artifacts"),
        ("artifacts/row_3_run_0/manifest.json", None),  # reserved by the reference
        ("artifacts/row_3_run_0/sub/manifest.json", "artifacts"),
        ("events.jsonl", None),
        ("manifest.json", None),
        ("trajectories/../events.jsonl", None),
        ("trajectories/notes.txt", None),
        ("/etc/passwd", None),
        ("artifacts\\row_1_run_0\\x", None),
    ],
)
def test_only_paths_of_the_fixed_layout_are_files_of_a_run(path, kind):
    assert file_type(path) == kind


def test_the_manifest_filters_by_type_and_row_and_serves_nothing_else(tmp_path):
    run = tmp_path / "run"
    for name, text in {
        "metrics.json": "{}",
        "summary.jsonl": "{}\n",
        "events.jsonl": "{}\n",
        "trajectories/row_1_run_0.json": "{}",
        "trajectories/row_2_run_0.json": "{}",
        "artifacts/row_2_run_0/a.txt": "hello",
    }.items():
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text(text)
    (run / "trajectories" / "row_9_run_0.json").symlink_to(tmp_path / "outside")
    everything = file_manifest(run, types=parse_types("all"), rows=None)
    assert [f.path for f in everything.files] == [
        "metrics.json",
        "summary.jsonl",
        "trajectories/row_1_run_0.json",
        "trajectories/row_2_run_0.json",
        "artifacts/row_2_run_0/a.txt",
    ]
    assert everything.totals.by_type["artifacts"].bytes == 5
    row_2 = file_manifest(run, types=parse_types(None), rows=parse_rows("2-3,100-999999999999"))
    assert [f.path for f in row_2.files] == [
        "metrics.json",
        "summary.jsonl",
        "trajectories/row_2_run_0.json",
    ]
    assert layout_file(run, "artifacts/row_2_run_0/a.txt").read_text() == "hello"
    for hidden in (
        "events.jsonl",
        "trajectories/row_9_run_0.json",
        "trajectories/row_5_run_0.json",
    ):
        with pytest.raises(NotFound):
            layout_file(run, hidden)


def test_a_manifest_lists_only_the_folders_its_types_and_rows_need(tmp_path, monkeypatch):
    # A run of 10,000 attempts has as many trajectory files and artifact folders; `eval info`
    # asks for metrics.json alone and must not walk them (it took seconds).
    run = tmp_path / "run"
    (run / "trajectories").mkdir(parents=True)
    (run / "metrics.json").write_text("{}")
    for r in range(300):
        (run / "trajectories" / f"row_{r}_run_0.json").write_text("{}")
        (run / "artifacts" / f"row_{r}_run_0" / "deep").mkdir(parents=True)
        (run / "artifacts" / f"row_{r}_run_0" / "deep" / "out.txt").write_text(str(r))
    listed: list[str] = []
    real_scandir = os.scandir

    def counting_scandir(path: Any = ".") -> Any:
        listed.append(str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", counting_scandir)
    only_metrics = file_manifest(run, types=["metrics"], rows=None)
    assert [f.path for f in only_metrics.files] == ["metrics.json"]
    assert listed == []
    one_row = file_manifest(run, types=["artifacts"], rows=parse_rows("7"))
    assert [f.path for f in one_row.files] == ["artifacts/row_7_run_0/deep/out.txt"]
    assert len(listed) <= 3  # artifacts/, its row-7 folder and that folder's subfolder
    monkeypatch.undo()
    everything = file_manifest(run, types=["artifacts"], rows=None)
    assert everything.totals.files == 300


def test_a_file_that_changes_gets_its_new_hash_in_the_next_manifest(tmp_path):
    import hashlib

    run = tmp_path / "run"
    (run / "trajectories").mkdir(parents=True)
    path = run / "trajectories" / "row_0_run_0.json"
    path.write_text('{"reward": 0}')

    def listed() -> str:
        manifest = file_manifest(run, types=parse_types("trajectories"), rows=None)
        return {f.path: f.sha256 for f in manifest.files}["trajectories/row_0_run_0.json"]

    assert listed() == hashlib.sha256(b'{"reward": 0}').hexdigest()
    assert listed() == hashlib.sha256(b'{"reward": 0}').hexdigest()  # remembered
    path.write_text('{"reward": 1}')  # same size, new bytes, in place
    assert listed() == hashlib.sha256(b'{"reward": 1}').hexdigest()
    replacement = run / "new.json"
    replacement.write_text('{"reward": 2}')
    os.replace(replacement, path)  # how run outputs are rewritten
    assert listed() == hashlib.sha256(b'{"reward": 2}').hexdigest()


def test_bad_types_and_rows_name_every_problem():
    with pytest.raises(ValidationFailed, match="unknown file type"):
        parse_types("metrics,bogus")
    with pytest.raises(ValidationFailed, match="cannot be combined"):
        parse_types("all,logs")
    with pytest.raises(ValidationFailed) as rows:
        parse_rows("x,5-3")
    assert len(rows.value.details["problems"]) == 2


# -- checkout ---------------------------------------------------------------------------------
def pushed_repo(root: Path) -> tuple[Path, Path]:
    tree, origin = root / "tree", root / "origin.git"
    tree.mkdir()
    subprocess.run(["git", "init", "-q", "--bare", str(origin)], check=True)
    git("init", "-q", "-b", "main", cwd=tree)
    git("remote", "add", "origin", str(origin), cwd=tree)
    (tree / "a.txt").write_text("one\n")
    git("add", "-A", cwd=tree)
    git("commit", "-q", "-m", "one", cwd=tree)
    git("push", "-q", "origin", "HEAD:main", cwd=tree)
    return tree, origin


def test_a_checkout_fetches_new_commits_and_refuses_unpushed_ones(tmp_path):
    tree, origin = pushed_repo(tmp_path)
    home, lines = tmp_path / "home", []
    first = git("rev-parse", "HEAD", cwd=tree)
    url = f"file://{origin}"
    one = checkout(
        home, workspace_id="w", origin_url=url, commit_sha=first, run_id="r1", log=lines.append
    )
    assert (one / "a.txt").read_text() == "one\n"
    assert mirror_path(home, workspace_id="w", origin_url=url).is_dir()

    (tree / "a.txt").write_text("two\n")
    git("commit", "-q", "-am", "two", cwd=tree)
    second = git("rev-parse", "HEAD", cwd=tree)
    with pytest.raises(CheckoutError, match="push it"):
        checkout(home, workspace_id="w", origin_url=url, commit_sha=second, run_id="r2", log=print)
    git("push", "-q", "origin", "HEAD:main", cwd=tree)
    two = checkout(
        home, workspace_id="w", origin_url=url, commit_sha=second, run_id="r2", log=lines.append
    )
    assert (two / "a.txt").read_text() == "two\n"
    assert (one / "a.txt").read_text() == "one\n"  # each run keeps its own commit
    assert any("fetching" in line for line in lines)
    again = checkout(
        home, workspace_id="w", origin_url=url, commit_sha=second, run_id="r2", log=lines.append
    )
    assert again == two and lines[-1].startswith("reusing")


def test_an_unreachable_origin_is_a_clear_error_without_its_credentials(tmp_path):
    with pytest.raises(CheckoutError) as failed:
        checkout(
            tmp_path / "home",
            workspace_id="w",
            origin_url=f"file://user:s3cret@localhost{tmp_path}/missing.git",
            commit_sha="ab" * 20,
            run_id="r",
            log=print,
        )
    assert "git clone failed" in str(failed.value)
    assert "s3cret" not in str(failed.value)
