"""`eval info DIR` and `eval view DIR` on a platform run fetched with `eval download` (issue 27,
part 7).

A real server process runs a small evaluation on its real worker against the scripted model
(one row right, one wrong, one grader exception, one removed; two attempts each); `eval
download --type all` fetches it. Then, with no platform reachable, `eval info --json DIR` and a
real `eval view DIR` process must show the platform's own status, pass rate, outcome counts
and pass@k, and the viewer's samples CSV every attempt with its outcome and its output.
"""

from __future__ import annotations

import csv
import io
import re
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from osmosis.testing import FakeModelServer
from tests.e2e.workspace import make_workspace, row
from tests.platform.conftest import CLI, clean_env
from tests.platform.test_eval_cli import CONFIG, wait_for
from tests.platform.test_workspaces import cli, cli_json
from tests.unit.test_git_state import git, new_repo

pytestmark = pytest.mark.slow

ROWS = [row("ok", 2, 7), row("wrong", 5, 7), row("grader_error", 3, 7), row("remove", 4, 4)]
N = 2


@pytest.fixture(scope="module")
def model() -> Iterator[FakeModelServer]:
    with FakeModelServer(script={"[wrong]": "0"}) as server:
        yield server


def workspace(root: Path, rows: list[dict], *, n: int) -> Path:
    """A workspace committed on `main` and pushed to `origin`."""
    tree = new_repo(root)
    make_workspace(tree, rows, n=n, limit=len(rows), secrets=["OPENAI_API_KEY", "OPENAI_API_BASE"])
    (tree / ".gitignore").write_text(".osmosis/\n")
    git(tree, "add", ".")
    git(tree, "commit", "-q", "-m", "workspace")
    git(tree, "push", "-q", "-u", "origin", "main")
    return tree


def submit(platform, model: FakeModelServer, tree: Path) -> tuple[str, dict[str, str]]:
    env = {
        **platform.env,
        "OPENAI_API_KEY": "sk-fake-for-the-run-77c1",
        "OPENAI_API_BASE": model.base_url,
    }
    cli_json("dataset", "upload", "data/scripted.jsonl", "-y", env=env, cwd=tree)
    return cli_json("eval", "submit", CONFIG, "-y", env=env, cwd=tree)["resource"]["name"], env


def download(name: str, env: dict[str, str], tree: Path) -> Path:
    fetched = cli_json("eval", "download", name, "--type", "all", env=env, cwd=tree)
    run_dir = Path(fetched["resource"]["output_path"])
    assert fetched["resource"]["status"] == "success" and not (run_dir / "manifest.json").exists()
    return run_dir


@pytest.fixture(scope="module")
def downloaded(running_platform, model, tmp_path_factory) -> tuple[Path, dict]:
    """A finished platform run downloaded whole: (its directory, the platform's `eval info`)."""
    tree = workspace(tmp_path_factory.mktemp("downloaded"), ROWS, n=N)
    name, env = submit(running_platform, model, tree)
    platform = wait_for(tree, env, name, {"finished", "failed", "stopped", "halted"})[-1]
    assert platform["eval_run"]["status"] == "finished", platform["eval_run"]["error"]
    return download(name, env, tree), platform


def offline(tmp_path: Path) -> dict[str, str]:
    """No platform configured: what is shown can only come from the directory."""
    return clean_env(OSMOSIS_HOME=str(tmp_path / "home"), OSMOSIS_CONFIG_DIR=str(tmp_path / "c"))


@pytest.mark.timeout(600)  # the fixture runs an evaluation on the platform's worker
def test_eval_info_on_a_downloaded_run_shows_the_platforms_status_and_metrics(downloaded, tmp_path):
    run_dir, platform = downloaded
    results = platform["results"]
    # The platform's own figures, as the scripted rows make them.
    assert results["outcomes"] == {"passed": 2, "not_passed": 2, "errored": 2, "skipped": 2}

    data = cli_json("eval", "info", str(run_dir), env=offline(tmp_path), cwd=tmp_path)["data"]
    assert data["source"] == "download" and data["output_path"] == str(run_dir)
    assert data["eval_run"]["status"] == "finished"
    assert data["eval_run"]["id"] == platform["eval_run"]["id"]
    assert data["eval_run"]["name"] == platform["eval_run"]["name"]
    assert data["progress"] == {"completed": 8, "total": 8}
    assert data["results"]["pass_rate"] == pytest.approx(results["pass_rate"])
    assert data["results"]["outcomes"] == results["outcomes"]
    assert data["results"]["pass_at_k"] == results["pass_at_k"]
    assert data["results"]["errors_by_type"] == results["errors_by_type"]

    shown = cli("eval", "info", str(run_dir), env=offline(tmp_path), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    text = re.sub(r"\s+", " ", shown.stdout)
    assert "finished (downloaded platform run)" in text
    assert f"{results['pass_rate']:.1%}" in text
    assert "2 passed" in text and "2 errored" in text, text


@pytest.mark.timeout(600)
def test_eval_view_on_a_downloaded_run_shows_its_status_and_every_attempt(downloaded, tmp_path):
    run_dir, platform = downloaded
    viewer = subprocess.Popen(
        [*CLI, "eval", "view", str(run_dir), "--port", "0"],
        env=offline(tmp_path), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    try:
        assert viewer.stdout is not None
        deadline, url = time.monotonic() + 60, None
        while url is None and time.monotonic() < deadline:
            line = viewer.stdout.readline()
            assert line or viewer.poll() is None, "eval view exited before it listened"
            found = re.search(r"(http://127\.0\.0\.1:\d+/)", line)
            url = found.group(1) if found else None
        assert url is not None, "eval view never said where it listens"
        assert "Viewing run" in line  # the directory is one run, not an empty list of runs

        page = httpx.get(f"{url}runs/{run_dir.name}", timeout=30)
        assert page.status_code == 200
        status = re.search(r'data-status="([^"]+)"', page.text)
        assert status is not None and status.group(1) == "finished"
        text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page.text))
        assert f"{platform['results']['pass_rate'] * 100:.1f}%" in text, text[:2000]
        assert platform["eval_run"]["id"] in text  # the platform's run, not a made-up id
        assert "8/8 samples" in text

        samples = httpx.get(f"{url}runs/{run_dir.name}/samples.csv", timeout=30)
        assert samples.status_code == 200
        rows = list(csv.DictReader(io.StringIO(samples.text)))
        assert sorted((int(r["row_index"]), int(r["run_index"])) for r in rows) == [
            (r, k) for r in range(len(ROWS)) for k in range(N)
        ]
        assert Counter(r["outcome"] for r in rows) == platform["results"]["outcomes"]
        # Each attempt's input and output come from its downloaded trajectory.
        by_kind = {}
        for found in rows:
            kind = re.search(r"\[(\w+)\]", found["input"])
            assert kind is not None, found
            by_kind.setdefault(kind.group(1), set()).add((found["outcome"], found["output"]))
        assert by_kind["ok"] == {("passed", "14")}
        assert by_kind["wrong"] == {("not_passed", "0")}
        assert {outcome for outcome, _ in by_kind["grader_error"]} == {"errored"}
        assert {outcome for outcome, _ in by_kind["remove"]} == {"skipped"}

        errored = httpx.get(f"{url}runs/{run_dir.name}/samples.csv?outcome=errored", timeout=30)
        assert len(list(csv.DictReader(io.StringIO(errored.text)))) == 2
    finally:
        viewer.terminate()
        viewer.wait(timeout=30)
        if viewer.stdout is not None:
            viewer.stdout.close()


@contextmanager
def viewing(run_dir: Path, env: dict[str, str]) -> Iterator[str]:
    """`osmosis eval view run_dir` as a process; yields the URL it listens at."""
    viewer = subprocess.Popen(
        [*CLI, "eval", "view", str(run_dir), "--port", "0"],
        env=env, cwd=run_dir.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert viewer.stdout is not None
        deadline, url = time.monotonic() + 60, None
        while url is None and time.monotonic() < deadline:
            line = viewer.stdout.readline()
            assert line or viewer.poll() is None, "eval view exited before it listened"
            found = re.search(r"(http://127\.0\.0\.1:\d+/)", line)
            url = found.group(1) if found else None
        assert url is not None, "eval view never said where it listens"
        assert "Viewing run" in line  # the directory is one run, not an empty list of runs
        yield url
    finally:
        viewer.terminate()
        viewer.wait(timeout=30)
        if viewer.stdout is not None:
            viewer.stdout.close()


@pytest.mark.timeout(600)
def test_a_stopped_run_downloaded_shows_stopped_and_only_what_it_recorded(
    running_platform, model, tmp_path
):
    rows = [
        row("ok", 2, 7),
        row("ok", 3, 7),
        row("ok", 4, 7, sleep=120),
        row("ok", 5, 7, sleep=120),
    ]
    tree = workspace(tmp_path / "stopped", rows, n=1)
    name, env = submit(running_platform, model, tree)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:  # the two quick rows done, the slow two still going
        data = cli_json("eval", "info", name, env=env, cwd=tree)["data"]
        if data["summary"]["progress"]["completed"] >= 2:
            break
        time.sleep(0.5)
    cli_json("eval", "stop", name, "-y", env=env, cwd=tree)
    platform = wait_for(tree, env, name, {"stopped"}, timeout=90)[-1]
    run_dir = download(name, env, tree)

    data = cli_json("eval", "info", str(run_dir), env=offline(tmp_path), cwd=tmp_path)["data"]
    assert data["eval_run"]["status"] == "stopped"
    recorded = platform["summary"]["progress"]["completed"]
    # The planned total is not in the download: not recorded, never the recorded count.
    assert data["progress"] == {"completed": recorded, "total": None}
    assert data["results"]["outcomes"] == platform["results"]["outcomes"]
    assert data["results"]["pass_rate"] == pytest.approx(platform["results"]["pass_rate"])

    with viewing(run_dir, offline(tmp_path)) as url:
        page = httpx.get(f"{url}runs/{run_dir.name}", timeout=30)
        status = re.search(r'data-status="([^"]+)"', page.text)
        assert status is not None and status.group(1) == "stopped"
        samples = httpx.get(f"{url}runs/{run_dir.name}/samples.csv", timeout=30)
        rows_seen = list(csv.DictReader(io.StringIO(samples.text)))
        assert len(rows_seen) == recorded
        assert Counter(r["outcome"] for r in rows_seen) == {
            k: v for k, v in platform["results"]["outcomes"].items() if v
        }
