"""The official osmosis-ai local-run layout, both ways (issue 26, part 4).

A real official run directory is made once by the official CLI's own `eval run` (from
.venv-interop) on a small workspace against the scripted model; a real one of ours by our
`eval run`. Then, against a live server: the official `eval upload` of the official run, our
`eval upload` of it, the official `eval upload` of ours; and, locally, our `eval info`,
`eval view` and `eval compare` on the official directory. Every figure is checked against what
the official run printed when it finished.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from osmosis.testing import FakeModelServer
from tests.e2e.conftest import CLI, model_env
from tests.e2e.workspace import OSMOSIS_AI_MAIN, SCRIPTED_MAIN, make_workspace, row
from tests.platform.conftest import RunningPlatform
from tests.platform.test_official_cli import (  # noqa: F401 - fixtures used by name
    IDENTITY,
    OFFICIAL,
    OfficialCli,
    interop_rollout_env,
    official,
)

pytestmark = [pytest.mark.interop, pytest.mark.slow]

# Two right, one wrong, one grader exception (failed), one removed (skipped); twice each.
ROWS = [row("ok", 2, 7), row("ok", 3, 7), row("wrong", 5, 7), row("grader_error", 2, 5),
        row("remove", 4, 4)]  # fmt: skip


@dataclass
class LocalRun:
    path: Path
    printed: dict
    """The `metrics` the run's own `eval run --json` printed when it finished."""


def _git(tree: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=tree, check=True, capture_output=True)


def _tree(root: Path, main: str) -> Path:
    """A workspace in `root` whose origin is github.com/<IDENTITY>, as the official CLI wants."""
    make_workspace(root, ROWS, n=2, limit=5, main=main)
    (root / "configs" / "training").mkdir()
    _git(root, "init", "-q", "-b", "main")
    _git(root, "remote", "add", "origin", f"https://github.com/{IDENTITY}.git")
    return root


@pytest.fixture(scope="module")
def model() -> Iterator[FakeModelServer]:
    with FakeModelServer(script={"[wrong]": "0"}) as server:
        yield server


@pytest.fixture(scope="module")
def official_run(model: FakeModelServer, tmp_path_factory: pytest.TempPathFactory) -> LocalRun:
    """`osmosis eval run` of the official CLI, its rollout written with osmosis-ai. The
    rollout's environment (which the official CLI syncs with uv, offline here) declares no
    dependency and reaches .venv-interop's osmosis-ai through a `.pth` file: no index, no
    cache, no network."""
    if not OFFICIAL.exists():
        pytest.skip("no .venv-interop (make install builds it when osmosis-ai installs here)")
    root = tmp_path_factory.mktemp("official-run")
    tree = _tree(root / "ws", OSMOSIS_AI_MAIN)
    rollout = tree / "rollouts" / "scripted"
    python = interop_rollout_env(rollout)
    env = model_env(
        model,
        HOME=str(root / "home"),
        LITELLM_LOCAL_MODEL_COST_MAP="True",  # else litellm fetches its price list online
        UV_OFFLINE="1",
        UV_CACHE_DIR=str(root / "uv-cache"),
        UV_PYTHON=python,
        UV_PYTHON_DOWNLOADS="never",
        NO_COLOR="1",
    )
    done = subprocess.run(
        [str(OFFICIAL), "--json", "eval", "run", "configs/eval/scripted.toml",
         "--dataset-file", "data/scripted.jsonl", "--name", "official-run", "-y"],
        cwd=tree, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    resource = json.loads(done.stdout)["resource"]
    return LocalRun(path=Path(resource["output_path"]), printed=resource["metrics"])


@pytest.fixture(scope="module")
def our_run(model: FakeModelServer, tmp_path_factory: pytest.TempPathFactory) -> LocalRun:
    """Our `osmosis eval run` of the same rows, with the rollout written with our SDK."""
    tree = _tree(tmp_path_factory.mktemp("our-run") / "ws", SCRIPTED_MAIN)
    done = subprocess.run(
        [*CLI, "--json", "eval", "run", "configs/eval/scripted.toml", "--name", "our-run", "-y"],
        cwd=tree, env=model_env(model), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    resource = json.loads(done.stdout)["resource"]
    return LocalRun(path=Path(resource["output_path"]), printed=resource["metrics"])


def _ours(*args: str, cwd: Path, platform: RunningPlatform | None = None) -> dict:
    """Our CLI as JSON; against `platform` when given."""
    env = _no_osmosis_env() | (platform.env if platform is not None else {})
    done = subprocess.run([*CLI, "--json", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    return json.loads(done.stdout)


def _no_osmosis_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("OSMOSIS_", "OPENAI_"))}


def _counts(summary: dict) -> tuple:
    return tuple(summary[k] for k in ("pass_rate", "graded", "passed", "failed", "skipped"))


def _renamed(run: LocalRun, root: Path, name: str) -> Path:
    """A copy of an official run directory as another local run (new name and id)."""
    copy = root / name
    shutil.copytree(run.path, copy)
    run_id = uuid.uuid4().hex
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest.update(run_name=name, local_run_id=run_id)
    (copy / "manifest.json").write_text(json.dumps(manifest, indent=2))
    metrics = json.loads((copy / "metrics.json").read_text())
    metrics["eval_run"].update(name=name, id=run_id)
    (copy / "metrics.json").write_text(json.dumps(metrics, indent=2))
    return copy


# -- the official run, read by our CLI ----------------------------------------------------------
def test_the_official_run_is_what_its_rows_say(official_run):
    printed = official_run.printed
    assert (printed["total_samples"], printed["passed"], printed["failed"],
            printed["skipped"], printed["pass_rate"]) == (10, 4, 2, 2, 0.5)  # fmt: skip
    assert not (official_run.path / "manifest.json").read_text().count("pass_threshold")


def test_our_eval_info_shows_an_official_run_finished_with_its_metrics(official_run):
    info = _ours("eval", "info", str(official_run.path), cwd=official_run.path)["data"]
    assert info["eval_run"]["status"] == "finished"  # not "running 0/10"
    assert info["progress"] == {"completed": 10, "total": 10}
    results = info["results"]
    assert _counts(results) == _counts(official_run.printed)
    assert results["outcomes"] == {"passed": 4, "not_passed": 2, "errored": 2, "skipped": 2}
    assert results["pass_threshold"] == 1.0
    rich = subprocess.run([*CLI, "eval", "info", str(official_run.path)], env=_no_osmosis_env(),
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert rich.returncode == 0, rich.stderr
    assert "finished (local run)" in rich.stdout and "10 / 10 samples" in rich.stdout
    assert "50.0%" in rich.stdout and "pass_threshold=1.0" in rich.stdout


def test_our_eval_compare_pairs_two_official_runs_row_by_row(official_run, tmp_path):
    other = _renamed(official_run, tmp_path, "official-copy")
    compared = _ours("eval", "compare", str(official_run.path), str(other), cwd=tmp_path)["data"]
    assert compared["problems"] == []
    (difference,) = compared["differences"]
    assert difference["paired_rows"] == 4  # row 4 was skipped both times: nothing to pair
    assert difference["pass_rate"]["baseline"] == official_run.printed["pass_rate"]
    assert difference["counts"]["same"] == 4


def test_our_eval_compare_pairs_an_official_run_with_ours_of_the_same_rows(
    official_run, our_run, tmp_path
):
    compared = _ours("eval", "compare", str(official_run.path), str(our_run.path),
                     cwd=tmp_path)["data"]  # fmt: skip
    assert compared["problems"] == []
    (difference,) = compared["differences"]
    assert difference["paired_rows"] == 4 and difference["counts"]["same"] == 4
    assert difference["pass_rate"] == {**difference["pass_rate"], "baseline": 0.5, "other": 0.5}


def test_our_eval_view_serves_an_official_run_finished_with_its_pass_rate(official_run):
    viewer = subprocess.Popen(
        [*CLI, "eval", "view", str(official_run.path), "--port", "0"],
        env=_no_osmosis_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert viewer.stdout is not None
        deadline, url = time.monotonic() + 60, None
        while url is None and time.monotonic() < deadline:
            found = re.search(r"(http://127\.0\.0\.1:\d+/)", viewer.stdout.readline())
            url = found.group(1) if found else None
        assert url is not None, "eval view never said where it listens"
        page = httpx.get(f"{url}runs/official-run", timeout=30)
        assert page.status_code == 200
        text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page.text))
        assert "finished" in text and "running" not in text
        assert "50.0%" in text or "50%" in text, text[:2000]
        samples = httpx.get(f"{url}runs/official-run/samples.csv", timeout=30)
        rows = list(csv.DictReader(io.StringIO(samples.text)))
        assert len(rows) == 10 and {r["outcome"] for r in rows} == {
            "passed", "not_passed", "errored", "skipped"}  # fmt: skip
        assert sum(r["outcome"] == "passed" for r in rows) == 4
    finally:
        viewer.terminate()
        viewer.wait(timeout=30)
        if viewer.stdout is not None:
            viewer.stdout.close()


# -- the official run, uploaded ---------------------------------------------------------------
def test_the_official_eval_upload_of_an_official_run_finishes_and_info_agrees(
    official,  # noqa: F811
    official_run,
):
    cli = OfficialCli(workspace=official_run.path.parents[2], env=official.env,
                      platform=official.platform)  # fmt: skip
    uploaded = cli.json("eval", "upload", str(official_run.path))
    assert uploaded["status"] == "success", uploaded
    name = uploaded["resource"]["eval_run_name"]
    assert name == "official-run"
    theirs = cli.json("eval", "info", name)["data"]
    assert theirs["eval_run"]["status"] == "finished"
    results = theirs["results"]
    printed = official_run.printed
    assert (results["pass_rate"], results["graded"], results["passed"], results["failed"],
            results["skipped"]) == _counts(printed)  # fmt: skip
    ours = official.ours("GET", f"/api/eval-runs/{name}").json()
    assert _counts(ours["summary"]) == _counts(printed)
    mine = _ours("eval", "info", name, cwd=cli.workspace, platform=official.platform)["data"]
    assert mine["eval_run"]["status"] == "finished"
    assert _counts(mine["metrics"]["summary"]) == _counts(printed)
    assert ours["summary"]["progress"] == {"completed": 10, "total": 10, "unit": "samples"}
    # The server converted the layout: trajectories are where our layout keeps them.
    files = official.ours("GET", f"/api/eval-runs/{name}/files?types=trajectories").json()
    paths = {f["path"] for f in files["files"]}
    assert "trajectories/row_0_run_0.json" in paths and len(paths) >= 10, paths
    # Twice is one run.
    again = cli.json("eval", "upload", str(official_run.path))
    assert again["resource"]["eval_run_id"] == uploaded["resource"]["eval_run_id"]


def test_our_eval_upload_of_an_official_run_dir(official, official_run, tmp_path):  # noqa: F811
    copy = _renamed(official_run, official_run.path.parent, f"official-ours-{uuid.uuid4().hex[:6]}")
    try:
        uploaded = _ours("eval", "upload", str(copy), cwd=copy, platform=official.platform)
        resource = uploaded["resource"]
        assert resource["status"] == "finalized" and resource["eval_run_name"] == copy.name
        info = _ours("eval", "info", copy.name, cwd=tmp_path, platform=official.platform)
        summary = info["data"]["metrics"]["summary"]
        assert _counts(summary) == _counts(official_run.printed)
        assert info["data"]["eval_run"]["status"] == "finished"
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def test_the_official_eval_upload_of_our_run_dir(official, our_run):  # noqa: F811
    trials = our_run.path / "rollout_trials"
    for line in (our_run.path / "index.jsonl").read_text().splitlines():
        entry = json.loads(line)
        trajectory = trials / entry["rollout_id"] / entry["trajectory_filename"]
        assert trajectory.is_file() and not trajectory.is_symlink()
    cli = OfficialCli(workspace=our_run.path.parents[2], env=official.env,
                      platform=official.platform)  # fmt: skip
    uploaded = cli.json("eval", "upload", str(our_run.path))
    assert uploaded["status"] == "success", uploaded
    name = uploaded["resource"]["eval_run_name"]
    results = cli.json("eval", "info", name)["data"]["results"]
    assert (results["pass_rate"], results["graded"], results["passed"], results["failed"],
            results["skipped"]) == _counts(our_run.printed)  # fmt: skip
    # The same rows give the same figures either way.
    assert _counts(our_run.printed) == (0.5, 6, 4, 2, 2)


# -- the routes themselves ----------------------------------------------------------------------
def _cli_api(cli: OfficialCli, method: str, path: str, **kwargs: object) -> httpx.Response:
    headers = {"Authorization": f"Bearer {cli.platform.admin_token}",
               "X-Osmosis-Git": IDENTITY, "X-Osmosis-CLI-Version": "0.3.8"}  # fmt: skip
    return httpx.request(method, cli.platform.url + path, headers=headers, timeout=30,
                         **kwargs)  # fmt: skip


def _declared(content: bytes, path: str) -> dict:
    return {"path": path, "size": len(content), "sha256": hashlib.sha256(content).hexdigest()}


def test_import_urls_check_size_sha256_and_the_object_and_finalize_names_what_is_missing(
    official,  # noqa: F811
):
    index = b'{"row_index": 0, "run_index": 0, "rollout_id": "' + b"a" * 32 + b'", ' \
        b'"status": "success", "reward": 1.0, "duration_ms": 5.0}\n'  # fmt: skip
    progress = b'{"total_runs": 1, "sampled_rows": 1, "total_dataset_rows": 1}'
    body = {
        "schema_version": 1, "local_run_id": uuid.uuid4().hex, "manifest_digest": "0" * 64,
        "run": {"name": "by-hand", "started_at": "2026-12-01T00:00:00Z",
                "completed_at": "2026-12-01T00:00:01Z",
                "experiment_config": {"rollout": {"name": "r", "source_digest": "d"},
                                      "entrypoint": "main.py", "model_path": "openai/m",
                                      "dataset": {"name": "d", "sha256": "0" * 64,
                                                  "selected_source_rows": "0-0"}},
                "evaluation_config": {"n": 1, "pass_threshold": 0.5}},
        "schema_versions": {"state_schema": 1}, "provenance": {"sdk_version": "0.3.8"},
        "files": [_declared(index, "index.jsonl"), _declared(progress, "progress.json")],
        "reimport": False,
    }  # fmt: skip
    outside = {**body, "files": [*body["files"], _declared(b"x", "trajectories/x.json")]}
    refused = _cli_api(official, "POST", "/api/cli/eval-runs/imports", json=outside)
    assert refused.status_code == 422 and "trajectories/x.json" in refused.json()["message"]
    assert "rollout_trials/<rollout_id>/trajectory*.json" in refused.json()["message"]
    started = _cli_api(official, "POST", "/api/cli/eval-runs/imports", json=body)
    assert started.status_code == 200, started.text
    session = started.json()["session_id"]
    assert started.json()["status"] == "uploading" and started.json()["uploaded_files"] == 0
    urls = _cli_api(official, "POST", f"/api/cli/eval-runs/imports/{session}/uploads",
                    json={"paths": ["index.jsonl", "progress.json"]}).json()["files"]  # fmt: skip
    assert [(f["path"], f["size"]) for f in urls] == [("index.jsonl", len(index)),
                                                      ("progress.json", len(progress))]  # fmt: skip
    index_url, progress_url = (f["upload"]["presigned_url"] for f in urls)
    assert httpx.put(index_url, content=index[:-1] + b" ", timeout=30).status_code == 422
    assert httpx.put(progress_url, content=index, timeout=30).status_code == 422  # too long
    other = index_url.replace("/index.jsonl?", "/progress.json?")
    assert httpx.put(other, content=progress, timeout=30).status_code == 403  # another object
    assert httpx.get(index_url, timeout=30).status_code == 403  # another method
    assert httpx.put(index_url, content=index, timeout=30).status_code == 200
    early = _cli_api(official, "POST", f"/api/cli/eval-runs/imports/{session}/finalize", json={})
    assert early.status_code == 409 and "progress.json" in early.json()["message"]
    assert httpx.put(progress_url, content=progress, timeout=30).status_code == 200
    left = _cli_api(official, "POST", f"/api/cli/eval-runs/imports/{session}/uploads",
                    json={"paths": ["index.jsonl", "progress.json"]})  # fmt: skip
    assert left.json() == {"files": []}  # nothing left to send
    done = _cli_api(official, "POST", f"/api/cli/eval-runs/imports/{session}/uploads/complete",
                    json={"path": "index.jsonl"})  # fmt: skip
    assert done.status_code == 200 and done.json()["state"] == "uploaded"
    final = _cli_api(official, "POST", f"/api/cli/eval-runs/imports/{session}/finalize", json={})
    assert final.status_code == 200, final.text
    assert final.json()["status"] == "finalized" and final.json()["platform_url"]
    run = official.ours("GET", f"/api/eval-runs/{final.json()['eval_run_id']}").json()
    # The server computed the metrics, with the threshold the upload declared (0.5).
    assert run["summary"]["pass_rate"] == 1.0 and run["summary"]["passed"] == 1
