"""`osmosis eval upload` and `eval run --upload` against a real platform server, with local
runs made by `eval run` against the scripted model; and `eval info` for local runs.

Each upload is verified (the server checks every file and recomputes the metrics),
resumable (files already there are not sent again), idempotent (twice is one run), and
`--replace` replaces an earlier upload's results.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from osmosis.client import PlatformAPIError, PlatformClient
from osmosis.eval.inputs.dataset_formats import sha256_file
from osmosis.eval.results.run_export import export_files
from osmosis.testing import FakeModelServer
from osmosis.wire.runs import ImportFileIn, ImportRunIn, RunImportCreate
from osmosis.workspace import resolve_workspace
from tests.e2e.conftest import model_env
from tests.e2e.workspace import row
from tests.platform.conftest import RunningPlatform
from tests.platform.test_eval_cli import CONFIG, eval_workspace

pytestmark = pytest.mark.slow

ROWS = [row("pass", 2, 2), row("breakable", 3, 3), row("pass", 4, 4), row("pass", 5, 5)]


@dataclass
class World:
    tree: Path
    env: dict[str, str]
    platform: RunningPlatform

    def cli(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        from tests.e2e.conftest import CLI

        return subprocess.run(
            [*CLI, *args],
            cwd=self.tree,
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=180,
        )

    def json(self, *args: str, **env: str) -> dict:
        done = self.cli("--json", *args, **env)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def error(self, *args: str, **env: str) -> dict:
        done = self.cli("--json", *args, **env)
        assert done.returncode == 1, done.stdout
        return json.loads(done.stderr)["error"]

    def local_run(self, name: str, *args: str, **env: str) -> Path:
        done = self.cli("eval", "run", CONFIG, "--name", name, "-y", *args, **env)
        assert done.returncode == 0, done.stderr
        return self.tree / ".osmosis" / "evals" / name

    def client(self) -> PlatformClient:
        return PlatformClient(self.platform.url, token=self.platform.admin_token, timeout=60)


@pytest.fixture(scope="module")
def world(
    running_platform: RunningPlatform,
    fake_model: FakeModelServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[World]:
    tree = eval_workspace(tmp_path_factory.mktemp("upload"), rows=ROWS)
    env = model_env(
        fake_model,
        OSMOSIS_HOME=running_platform.env["OSMOSIS_HOME"],
        OSMOSIS_CONFIG_DIR=running_platform.env["OSMOSIS_CONFIG_DIR"],
    )
    yield World(tree=tree, env=env, platform=running_platform)


@pytest.fixture(scope="module")
def fake_model() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


def local_summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())["summary"]


def test_an_uploaded_run_shows_the_same_metrics_on_the_platform(world: World) -> None:
    run_dir = world.local_run("shared-1")

    uploaded = world.json("eval", "upload", "shared-1")
    info = world.json("eval", "info", uploaded["resource"]["eval_run_name"])

    resource = uploaded["resource"]
    assert uploaded["operation"] == "eval.upload" and resource["status"] == "finalized"
    assert resource["eval_run_name"] == "shared-1"  # the local name, free on the platform
    assert resource["uploaded_files"] == resource["expected_files"] > 6
    data = info["data"]
    assert data["eval_run"]["status"] == "finished"
    summary = local_summary(run_dir)
    assert data["metrics"]["summary"] == summary
    assert data["metrics"]["eval_run"]["id"] == resource["eval_run_id"]
    results = data["results"]
    assert (results["graded"], results["passed"], results["failed"]) == (
        summary["graded"],
        summary["passed"],
        summary["failed"],
    )
    assert results["pass_rate"] == summary["pass_rate"] == 1.0
    assert results["confidence_intervals"] == summary["confidence_intervals"]
    assert data["summary"]["progress"] == {"completed": 4, "total": 4, "unit": "samples"}
    with world.client() as client:
        attempts = client.runs.attempts(resource["eval_run_id"], limit=50)
        files = client.runs.files(resource["eval_run_id"], types=["trajectories"])
    assert [(a.row_index, a.status) for a in attempts.attempts] == [
        (r, "success") for r in range(4)
    ]
    assert {f.path for f in files.files} >= {f"trajectories/row_{r}_run_0.json" for r in range(4)}
    # A local run and a platform run compare row by row (the platform one named by its id).
    mixed = world.json("eval", "compare", "shared-1", resource["eval_run_id"])["data"]
    assert mixed["differences"][0]["counts"] == {
        "regressed": 0,
        "improved": 0,
        "same": 4,
        "missing": 0,
    }
    # The local run was not touched by `eval info` (its metrics keep the local identity).
    assert json.loads((run_dir / "metrics.json").read_text())["eval_run"]["name"] == "shared-1"


def test_uploading_twice_makes_one_run_and_sends_nothing_again(world: World) -> None:
    world.local_run("twice")

    first = world.json("eval", "upload", "twice")["resource"]
    second = world.json("eval", "upload", "twice")["resource"]

    assert second["eval_run_id"] == first["eval_run_id"]
    assert second["uploaded_files"] == 0 and second["skipped_files"] == first["expected_files"]
    listed = world.json("eval", "list", "--limit", "50")["items"]
    assert [item["name"] for item in listed].count("twice") == 1
    # The platform has no commit to re-run it from: a retry says where to retry instead.
    retried = world.error("eval", "retry", "twice", "-y")
    assert retried["code"] == "CONFLICT" and "uploaded from a local run" in retried["message"]


def test_an_interrupted_upload_sends_only_what_is_missing(world: World) -> None:
    run_dir = world.local_run("resumable")
    files = export_files(run_dir)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    body = RunImportCreate(
        local_run_id=manifest["local_run_id"],
        manifest_digest=sha256_file(run_dir / "manifest.json"),
        run=ImportRunIn(name="resumable"),
        files=[ImportFileIn(path=f.path, size=f.size, sha256=f.sha256) for f in files],
    )
    identity = resolve_workspace(world.tree).identity
    with world.client() as client:
        session = client.imports.start(git=identity, body=body)
        for item in files[:3]:  # then the connection "drops"
            client.imports.upload_file(
                session.session_id, item.path, run_dir / item.path, size=item.size
            )
        with pytest.raises(PlatformAPIError) as early:
            client.imports.finalize(session.session_id)
    assert early.value.code == "CONFLICT" and "not uploaded yet" in early.value.message

    resumed = world.json("eval", "upload", "resumable")["resource"]

    assert resumed["session_id"] == session.session_id
    assert resumed["skipped_files"] == 3
    assert resumed["uploaded_files"] == len(files) - 3


def test_a_run_changed_since_its_upload_needs_replace(world: World) -> None:
    run_dir = world.local_run("changed", BREAK_GRADER="1")
    first = world.json("eval", "upload", "changed")["resource"]
    assert local_summary(run_dir)["failed"] == 1
    world.local_run("changed", "--retry-failed")  # now every row passes

    refused = world.error("eval", "upload", "changed")
    replaced = world.json("eval", "upload", "changed", "--replace")["resource"]
    info = world.json("eval", "info", "changed")["data"]

    assert refused["code"] == "CONFLICT" and "--replace" in refused["message"]
    assert replaced["eval_run_id"] == first["eval_run_id"]
    assert replaced["skipped_files"] > 0  # unchanged trajectories stayed on the platform
    assert info["metrics"]["summary"] == local_summary(run_dir)
    assert info["results"]["failed"] == 0 and info["results"]["passed"] == 4


def test_an_incomplete_or_altered_run_is_refused_with_every_problem(world: World) -> None:
    run_dir = world.local_run("altered")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    metrics["summary"]["passed"] = 0
    metrics["eval_run"]["status"] = "incomplete"
    (run_dir / "metrics.json").write_text(json.dumps(metrics))

    error = world.error("eval", "upload", "altered")

    problems = error["details"]["problems"]
    assert any("eval_run.status is 'incomplete'" in p for p in problems)
    assert any("does not match index.jsonl" in p for p in problems)
    assert error["code"] == "VALIDATION" and "altered cannot be uploaded" in error["message"]


def test_the_server_checks_the_files_itself(world: World) -> None:
    # A client that skips the local checks: the server still refuses a summary that lies.
    run_dir = world.local_run("lying")
    metrics_path = run_dir / "metrics.json"
    metrics = json.loads(metrics_path.read_text())
    metrics["summary"]["pass_rate"] = 0.25
    metrics_path.write_text(json.dumps(metrics))
    files = export_files(run_dir)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    body = RunImportCreate(
        local_run_id=manifest["local_run_id"],
        manifest_digest=sha256_file(run_dir / "manifest.json"),
        run=ImportRunIn(name="lying"),
        files=[ImportFileIn(path=f.path, size=f.size, sha256=f.sha256) for f in files],
    )
    with world.client() as client:
        session = client.imports.start(git=resolve_workspace(world.tree).identity, body=body)
        for item in files:
            client.imports.upload_file(
                session.session_id, item.path, run_dir / item.path, size=item.size
            )
        with pytest.raises(PlatformAPIError) as refused:
            client.imports.finalize(session.session_id)
        with pytest.raises(PlatformAPIError) as wrong_bytes:
            client.imports.upload_file(
                session.session_id, "logs.txt", run_dir / "index.jsonl", size=10
            )
        names = [run.name for run in client.runs.list(all_workspaces=True).eval_runs]
    assert refused.value.code == "VALIDATION"
    assert any("does not match index.jsonl" in p for p in refused.value.details["problems"])
    assert wrong_bytes.value.code == "VALIDATION" and "logs.txt" in wrong_bytes.value.message
    assert "lying" not in names


def test_eval_run_upload_uploads_a_finished_run(world: World) -> None:
    done = world.json("eval", "run", CONFIG, "--name", "straight-up", "-y", "--upload")

    upload = done["resource"]["upload"]
    assert upload["eval_run_name"] == "straight-up" and upload["status"] == "finalized"
    info = world.json("eval", "info", "straight-up")["data"]
    assert info["metrics"]["summary"] == done["resource"]["metrics"]


def test_eval_info_answers_for_a_local_run_the_platform_does_not_know(world: World) -> None:
    world.local_run("only-here")
    offline = {"OSMOSIS_PLATFORM_URL": "http://127.0.0.1:9", "OSMOSIS_TOKEN": "osm_nothing"}

    known = world.json("eval", "info", "only-here")["data"]
    unreachable = world.json("eval", "info", "only-here", **offline)["data"]
    by_path = world.json("eval", "info", str(world.tree / ".osmosis" / "evals" / "only-here"))
    rich = world.cli("eval", "info", "only-here")
    missing = world.error("eval", "info", "nowhere")

    for data in (known, unreachable, by_path["data"]):
        assert data["source"] == "local"
        assert data["eval_run"]["status"] == "finished"
        assert data["results"]["pass_rate"] == 1.0
    assert "Local evaluation run only-here" in rich.stdout
    assert missing["code"] == "NOT_FOUND"
