"""Evaluation runs executed by the platform: a real server process, real worker and rollout
processes, a real git origin, the scripted model; driven over HTTP through the typed client."""

from __future__ import annotations

import hashlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from osmosis.client import PlatformAPIError
from osmosis.testing import Fail, FakeModelServer, Rule
from tests.e2e.conftest import model_env
from tests.e2e.conftest import osmosis as osmosis_in
from tests.e2e.workspace import SCRIPTED_MAIN, row
from tests.platform.conftest import clean_env
from tests.platform.eval_world import (
    Repo,
    Server,
    all_logs,
    finished,
    gone_within,
    make_repo,
    pids_of,
    read_jsonl,
    recorded_at_least,
    run_body,
    run_dir,
    submit,
    upload_dataset,
)
from tests.platform.test_workspaces import new_user

pytestmark = pytest.mark.slow

# The scripted rollout, with a grader that breaks while a file exists (so a retry can heal it).
BREAKABLE_MAIN = SCRIPTED_MAIN.replace(
    'os.environ.get("BREAK_GRADER")', 'Path(os.environ["BREAK_FILE"]).exists()'
)
FOUR_PASSING = [row("pass", a, 3) for a in range(2, 6)]  # datasets need at least 4 rows
SUMMARY_KEYS = (
    "total_samples",
    "completed_samples",
    "graded",
    "passed",
    "failed",
    "skipped",
    "pass_rate",
    "pass_threshold",
    "tokens_used",
    "reward_stats",
    "n_runs",
    "pass_at_k",
    "errors_by_type",
)


@pytest.fixture(scope="module")
def fake_model() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


@pytest.fixture(scope="module")
def server(tmp_path_factory, fake_model, module_databases) -> Iterator[Server]:
    """One platform executing one run at a time (so queueing is observable)."""
    platform = Server.start(
        tmp_path_factory.mktemp("platform"),
        fake_model,
        databases=module_databases,
        OSMOSIS_MAX_CONCURRENT_RUNS="1",
    )
    yield platform
    platform.stop()


@pytest.fixture(scope="module")
def host_channel_server(tmp_path_factory, fake_model, module_databases) -> Iterator[Server]:
    """The same platform with the rollout sandbox off (OSMOSIS_SANDBOX=off), for the tests
    whose rollout talks to the test through host files: it writes its pid to PID_FILE (which
    the test then kills) or reads BREAK_FILE / GATE_FILE. A sandboxed rollout sees neither
    the test's files nor host pids (its own PID namespace); tests/platform/test_sandbox.py
    covers stopping and restarting sandboxed rollout servers through their host pids."""
    platform = Server.start(
        tmp_path_factory.mktemp("platform-host-files"),
        fake_model,
        databases=module_databases,
        OSMOSIS_MAX_CONCURRENT_RUNS="1",
        OSMOSIS_SANDBOX="off",
    )
    yield platform
    platform.stop()


def workspace(tmp_path: Path, server: Server, rows: list[dict], **options: object) -> Repo:
    repo = make_repo(tmp_path, rows, **options)
    upload_dataset(server, repo)
    return repo


# -- the user's round trip ------------------------------------------------------------------
def test_a_run_finishes_with_the_metrics_of_the_same_local_run(server, fake_model, tmp_path):
    rows = [
        row("pass", 6, 7),
        {**row("wrong", 2, 3), "ground_truth": "0"},
        row("grader_error", 2, 5),
        row("remove", 4, 4),
        row("pass", 3, 9),
    ]
    repo = workspace(tmp_path, server, rows, n=2, limit=5)
    with server.client() as client:
        created = submit(client, repo)
        assert created.status == "pending" and created.name.startswith("scripted-")
        detail = finished(client, created.name)
        assert detail.eval_run.status == "finished", list(all_logs(client, created.id))
        assert detail.eval_run.error is None
        assert detail.summary.progress.model_dump() == {
            "completed": 10,
            "total": 10,
            "unit": "samples",
        }
        assert (detail.summary.graded, detail.summary.passed) == (6, 4)
        assert (detail.summary.failed, detail.summary.skipped) == (2, 2)
        assert detail.summary.pass_rate == pytest.approx(0.5)
        assert detail.errors_by_type == {"agent_error": 2}
        assert detail.commit_sha == repo.commit_sha and detail.entrypoint == "main.py"
        assert detail.dataset.name == "scripted" and detail.dataset.rows == 5
        assert detail.metrics_available and detail.metrics is not None
        platform_summary = detail.metrics["summary"]
        assert detail.metrics["eval_run"]["dataset_name"] == "scripted"
        # The metrics.json users download names the platform run, not the engine's directory.
        identity = {k: detail.metrics["eval_run"][k] for k in ("id", "name", "status")}
        assert identity == {"id": created.id, "name": created.name, "status": "finished"}
        assert detail.metrics["eval_run"]["duration_ms"] == detail.eval_run.duration_ms

        listed = client.runs.list(git=repo.git)
        assert [run.name for run in listed.eval_runs][:1] == [created.name]
        assert listed.eval_runs[0].summary.progress.completed == 10

        attempts = client.runs.attempts(created.id, limit=200)
        assert attempts.total_count == 10
        assert sorted((a.row_index, a.run_index) for a in attempts.attempts) == [
            (r, k) for r in range(5) for k in range(2)
        ]
        # `limit` takes the first rows: each row is the dataset row of the same number.
        assert [a.source_row_index for a in attempts.attempts] == [
            a.row_index for a in attempts.attempts
        ]
        failed = client.runs.attempts(created.id, status="failed")
        assert {a.error_type for a in failed.attempts} == {"agent_error"}
        best = client.runs.attempts(created.id, sort="-reward", limit=1).attempts[0]
        assert best.reward == 1.0

        manifest = client.runs.files(created.id, types=["all"])
        paths = {f.path for f in manifest.files}
        assert {"metrics.json", "summary.jsonl", "logs.txt"} <= paths
        assert {f"trajectories/row_{r}_run_{k}.json" for r in range(5) for k in range(2)} <= paths
        assert manifest.totals.files == len(manifest.files)
        trajectory = next(f for f in manifest.files if f.path.startswith("trajectories/"))
        dest = tmp_path / "download" / trajectory.path
        assert client.runs.download_file(created.id, trajectory.path, dest) == trajectory.size
        assert hashlib.sha256(dest.read_bytes()).hexdigest() == trajectory.sha256
        only_row_1 = client.runs.files(created.id, types=["trajectories"], rows="1")
        assert {f.path for f in only_row_1.files} == {
            "summary.jsonl",
            "trajectories/row_1_run_0.json",
            "trajectories/row_1_run_1.json",
        }
        with pytest.raises(PlatformAPIError) as outside:
            client.runs.download_file(created.id, "manifest.json", tmp_path / "m")
        assert outside.value.status_code == 404

        logs = list(all_logs(client, created.id))
        assert any("checked out" in line for line in logs)
        assert any(line.startswith("[rollout/") for line in logs)

    local = osmosis_in(
        "eval", "run", str(repo.config), "--name", "local", "-y", "--json",
        cwd=repo.tree, env=model_env(fake_model),
    )  # fmt: skip
    assert local.returncode == 0, local.stderr
    local_summary = json.loads(local.stdout)["resource"]["metrics"]
    assert {k: platform_summary.get(k) for k in SUMMARY_KEYS} == {
        k: local_summary.get(k) for k in SUMMARY_KEYS
    }

    # `eval info` shows both pass@k and pass^k, the progress as a percentage, the dataset.
    cli_env = clean_env(
        OSMOSIS_PLATFORM_URL=server.url,
        OSMOSIS_TOKEN=server.admin_token,
        OSMOSIS_CONFIG_DIR=str(tmp_path / "cli"),
        COLUMNS="200",
    )
    info = osmosis_in("eval", "info", created.name, cwd=repo.tree, env=cli_env)
    assert info.returncode == 0, info.stderr
    hat = ", ".join(f"{p['k']}: {p['value']:.1%}" for p in local_summary["pass_hat_k"])
    for shown in ("10 / 10 samples (100%)", f"Pass^k          {hat}", "5 of 5 rows"):
        assert shown in info.stdout, shown
    data = json.loads(
        osmosis_in("--json", "eval", "info", created.id, cwd=repo.tree, env=cli_env).stdout
    )["data"]
    assert data["results"]["pass_hat_k"] == local_summary["pass_hat_k"]
    assert data["dataset_df_stats"]["rows"] == data["dataset_df_stats"]["selected_rows"] == 5


def test_eval_info_names_a_platform_runs_flaky_rows(server, tmp_path):
    # Row 0 passes its first attempt only (one rollout server sees both): 1 of 2, flaky.
    rows = [row("pass_first_1", 2, 7), row("pass", 3, 7), row("pass", 4, 7), row("pass", 5, 7)]
    repo = workspace(tmp_path, server, rows, n=2, limit=4)
    with server.client() as client:
        created = submit(client, repo)
        detail = finished(client, created.id)
    assert detail.eval_run.status == "finished"
    assert detail.flaky_rows == [0]
    cli_env = clean_env(OSMOSIS_PLATFORM_URL=server.url, OSMOSIS_TOKEN=server.admin_token,
                        OSMOSIS_CONFIG_DIR=str(tmp_path / "cli"), COLUMNS="200")  # fmt: skip
    info = osmosis_in("eval", "info", created.name, cwd=repo.tree, env=cli_env)
    assert info.returncode == 0, info.stderr
    assert "0 (attempts disagree within the run)" in info.stdout


# -- submit checks ----------------------------------------------------------------------------
def test_submit_names_every_problem_and_stores_nothing(server, tmp_path):
    repo = make_repo(tmp_path, FOUR_PASSING, limit=1, secrets=["API_TOKEN", "OTHER_TOKEN"])
    with server.client() as client:
        before = client.runs.list(git=repo.git).total_count
        # No dataset uploaded, and neither secret stored nor provided.
        with pytest.raises(PlatformAPIError) as missing:
            submit(client, repo)
        error = missing.value
        assert error.status_code == 404
        assert "Secret(s) not found: API_TOKEN, OTHER_TOKEN" in error.message
        assert "scripted" in error.message  # the dataset, named
        assert error.details["missing"] == ["API_TOKEN", "OTHER_TOKEN"]
        assert len(error.details["problems"]) == 2

        upload_dataset(server, repo)
        client.secrets.set(git=repo.git, name="API_TOKEN", value="stored", scope="workspace")
        with pytest.raises(PlatformAPIError) as one_left:
            submit(client, repo)
        assert one_left.value.status_code == 404
        assert one_left.value.message.endswith("Secret(s) not found: OTHER_TOKEN")

        broken = repo.config.read_text().replace("n = 1", 'n = "two"\nlimt = 3')
        with pytest.raises(PlatformAPIError) as invalid:
            submit(client, repo, config_text=broken, provided={"OTHER_TOKEN": "x"})
        assert invalid.value.status_code == 422
        keys = {issue["key"] for issue in invalid.value.details["issues"]}
        assert {"evaluation.n", "evaluation.limt"} <= keys

        body = run_body(repo, provided={"OTHER_TOKEN": "x"})
        body.repository.origin_url = str(tmp_path / "someone-elses.git")
        with pytest.raises(PlatformAPIError) as elsewhere:
            client.runs.submit(git=repo.git, body=body)
        assert elsewhere.value.status_code == 422
        assert "not the origin of this workspace" in elsewhere.value.message

        assert client.runs.list(git=repo.git).total_count == before

        created = submit(client, repo, provided={"OTHER_TOKEN": "given-for-this-run"})
        detail = client.runs.get(created.id)
        assert detail.resolved_secret_scopes == {"API_TOKEN": "workspace", "OTHER_TOKEN": "run"}
        assert "given-for-this-run" not in detail.model_dump_json()
        finished(client, created.id)


# -- stop, retry ------------------------------------------------------------------------------
def test_stop_keeps_what_finished_and_stops_the_rollout(host_channel_server, tmp_path):
    pid_file = tmp_path / "rollout.pid"
    rows = [row("pass", a, 7, sleep=0.3) for a in range(2, 22)]
    repo = workspace(
        tmp_path,
        host_channel_server,
        rows,
        limit=20,
        batch_size=1,
        env={"PID_FILE": str(pid_file)},
    )
    with host_channel_server.client() as client:
        created = submit(client, repo)
        recorded_at_least(client, created.id, 3)
        rollout_pid = int(pid_file.read_text())
        stopped = client.runs.stop(created.name)
        assert stopped.status == "stopped" and "stopped" in stopped.message
        assert gone_within(rollout_pid, seconds=10), "the rollout server outlived the stop"
        assert all(gone_within(pid, seconds=10) for pid in pids_of(created.id)), "worker"
        detail = client.runs.get(created.id)
        done = detail.summary.progress.completed
        assert 3 <= done < 20 and detail.summary.passed == done
        assert detail.metrics is not None
        assert detail.metrics["summary"]["total_samples"] == done
        assert detail.metrics["eval_run"]["status"] == "stopped"
        assert client.runs.attempts(created.id).total_count == done
        journal = read_jsonl(run_dir(host_channel_server, created.id) / "events.jsonl")
        assert len(journal) == done
        with pytest.raises(PlatformAPIError) as again:
            client.runs.stop(created.id)
        assert again.value.status_code == 409

        # A retry resumes what the stop left unrun; it does not say "from the start".
        retried = client.runs.retry(created.id)
        assert retried.retryable_samples == 20 - done
        resumed = finished(client, created.id)
        assert resumed.eval_run.status == "finished"
        assert (resumed.summary.progress.completed, resumed.summary.passed) == (20, 20)
        journal = read_jsonl(run_dir(host_channel_server, created.id) / "events.jsonl")
        assert len(journal) == 20  # the attempts before the stop were not run again


def test_retry_reruns_the_failures_with_fresh_rollout_ids(host_channel_server, tmp_path):
    broken = tmp_path / "broken"
    broken.touch()
    rows = [row("pass", 2, 2), row("breakable", 3, 3), row("pass", 4, 4), row("breakable", 5, 5)]
    repo = workspace(
        tmp_path,
        host_channel_server,
        rows,
        limit=4,
        main=BREAKABLE_MAIN,
        env={"BREAK_FILE": str(broken)},
    )
    with host_channel_server.client() as client:
        created = submit(client, repo)
        first = finished(client, created.id)
        assert (first.eval_run.status, first.summary.failed, first.summary.passed) == (
            "finished",
            2,
            2,
        )
        before = {a.row_index: a for a in client.runs.attempts(created.id).attempts}

        broken.unlink()
        retried = client.runs.retry(created.name)
        assert (retried.status, retried.retryable_samples) == ("pending", 2)
        second = finished(client, created.id)
        assert second.eval_run.status == "finished"
        story = "\n".join(all_logs(client, created.id))  # says why, should this ever fail
        assert (second.summary.passed, second.summary.failed) == (4, 0), story
        assert second.metrics is not None and second.metrics["summary"]["passed"] == 4
        after = {a.row_index: a for a in client.runs.attempts(created.id).attempts}
        for r in (1, 3):
            assert after[r].rollout_id != before[r].rollout_id and after[r].status == "success"
        for r in (0, 2):
            assert after[r].rollout_id == before[r].rollout_id
        with pytest.raises(PlatformAPIError) as nothing_left:
            client.runs.retry(created.id)
        assert nothing_left.value.status_code == 409


def test_secrets_given_for_a_run_are_never_stored_and_a_retry_needs_them_again(
    host_channel_server, tmp_path
):
    secret = "s3cr3t-RUN-VALUE-9876"
    broken = tmp_path / "broken"
    broken.touch()
    rows = [row("pass", 2, 2), row("breakable", 3, 3), row("pass", 4, 4), row("pass", 5, 5)]
    repo = workspace(
        tmp_path,
        host_channel_server,
        rows,
        limit=2,
        main=BREAKABLE_MAIN,
        secrets=["SHOUT_SECRET"],
        env={"BREAK_FILE": str(broken)},
    )
    with host_channel_server.client() as client:
        created = submit(client, repo, provided={"SHOUT_SECRET": secret})
        first = finished(client, created.id)
        assert (first.eval_run.status, first.summary.failed) == ("finished", 1)
        assert first.resolved_secret_scopes == {"SHOUT_SECRET": "run"}
        logs = "\n".join(all_logs(client, created.id))
        assert "starting with secret [REDACTED]" in logs  # the rollout printed it; redacted
        broken.unlink()
        with pytest.raises(PlatformAPIError) as needs_value:
            client.runs.retry(created.id)
        assert needs_value.value.status_code == 422
        assert needs_value.value.details["run_secret_names"] == ["SHOUT_SECRET"]
        client.runs.retry(created.id, secrets={"SHOUT_SECRET": secret})
        second = finished(client, created.id)
        assert (second.eval_run.status, second.summary.passed) == ("finished", 2)
    # Not in the database (its value was one ciphertext, wiped at the end), logs or results.
    assert files_holding(host_channel_server.home, secret.encode()) == []


def files_holding(root: Path, needle: bytes) -> list[Path]:
    """The files under `root` that hold `needle`. The server goes on working meanwhile (it
    removes a finished run's checkout in the background): what is gone before it is read
    holds nothing any more, and is skipped."""
    found = []
    for folder, _, names in os.walk(root):  # a folder removed while walked is skipped
        for name in names:
            path = Path(folder, name)
            try:
                if path.is_file() and needle in path.read_bytes():  # not a socket or fifo
                    found.append(path)
            except FileNotFoundError:
                continue
    return found


# -- scheduling and isolation ----------------------------------------------------------------
def test_a_second_run_waits_while_the_first_holds_the_only_slot(server, tmp_path):
    rows = [row("pass", a, 3, sleep=0.2) for a in range(2, 12)]
    repo = workspace(tmp_path, server, rows, limit=10, batch_size=1)
    with server.client() as client:
        first = submit(client, repo)
        second = submit(client, repo)
        third = submit(client, repo)
        recorded_at_least(client, first.id, 2)
        stopped = client.runs.stop(third.name)  # a pending run stops at once
        assert stopped.status == "stopped"
        assert client.runs.get(third.id).eval_run.started_at is None
        assert client.runs.get(first.id).eval_run.status == "running"
        waiting = client.runs.get(second.id)
        assert waiting.eval_run.status == "pending" and waiting.eval_run.started_at is None
        with pytest.raises(PlatformAPIError) as not_yet:
            client.runs.files(second.id)
        assert not_yet.value.status_code == 409
        done = finished(client, first.id)
        assert finished(client, second.id).eval_run.status == "finished"
        started = client.runs.get(second.id).eval_run.started_at
        assert started is not None and done.eval_run.completed_at is not None
        assert started >= done.eval_run.completed_at.replace(microsecond=0)
        assert client.runs.get(third.id).eval_run.status == "stopped"
        assert client.runs.attempts(third.id).total_count == 0


def test_users_see_only_the_runs_of_their_workspaces(server, tmp_path):
    repo = workspace(tmp_path, server, FOUR_PASSING, limit=1)
    stranger, _ = new_user(server, "stranger")
    with server.client() as admin, server.client(stranger["token"]) as other:
        created = submit(admin, repo)
        finished(admin, created.id)
        assert created.id not in {r.id for r in other.runs.list(all_workspaces=True).eval_runs}
        target = tmp_path / "x"
        calls = [
            (other.runs.get, ()),
            (other.runs.logs, ()),
            (other.runs.files, ()),
            (other.runs.download_file, ("metrics.json", target)),
            (other.runs.attempts, ()),
            (other.runs.stop, ()),
            (other.runs.retry, ()),
        ]
        for ref in (created.id, created.name):
            for method, args in calls:
                with pytest.raises(PlatformAPIError) as hidden:
                    method(ref, *args)  # type: ignore[operator]
                assert hidden.value.status_code == 404, method
                assert "not found among your workspaces" in hidden.value.message
        with pytest.raises(PlatformAPIError) as not_member:
            other.runs.list(git=repo.git)
        assert not_member.value.status_code == 404
        assert not target.exists()


def test_runs_that_cannot_start_fail_with_the_reason_and_record_nothing(server, tmp_path):
    repo = workspace(tmp_path, server, FOUR_PASSING, limit=4)
    good = repo.config.read_text()
    with server.client() as client:
        # Config values come from the local file: an unreachable model, never committed.
        repo.config.write_text(good.replace("openai/fake-model", "hosted_vllm/qwen3"))
        no_model = submit(client, repo)
        repo.config.write_text(good)
        body = run_body(repo)
        body.repository.commit_sha = "ab" * 20  # never pushed
        no_commit = client.runs.submit(git=repo.git, body=body)
        (repo.tree / "rollouts" / "scripted" / "main.py").write_text(
            'raise SystemExit("cannot start: the tool registry is missing")\n'
        )
        repo.push("broken entrypoint")
        no_server = submit(client, repo)
        expected = {
            no_model.id: "HOSTED_VLLM_API_BASE",
            no_commit.id: f"commit {'ab' * 20} is not in",
            no_server.id: "cannot start: the tool registry is missing",
        }
        for run_id, reason in expected.items():
            detail = finished(client, run_id)
            assert detail.eval_run.status == "failed"
            assert detail.eval_run.error is not None and reason in detail.eval_run.error
            assert any(reason in line for line in all_logs(client, run_id))
            assert detail.summary.progress.completed == 0
            assert client.runs.attempts(run_id).total_count == 0


# -- faults -----------------------------------------------------------------------------------
def test_provider_errors_for_a_while_are_retried_not_recorded_as_failures(
    server, fake_model, tmp_path
):
    rows = [{**row("pass", a, 3), "user_prompt": f"What is {a} * 3? [flaky]"} for a in range(2, 6)]
    repo = workspace(tmp_path, server, rows, limit=4, batch_size=4)
    served = fake_model.stats().chat_completions
    fake_model.add_rule(Rule(contains="[flaky]", respond=Fail(500), times=3))
    try:
        with server.client() as client:
            detail = finished(client, submit(client, repo).id)
    finally:
        fake_model.clear_rules()
    assert detail.eval_run.status == "finished"
    assert (detail.summary.passed, detail.summary.failed) == (4, 0)
    # 3 refused calls, answered again: the 4 rows' calls plus the pre-flight probe and retries.
    assert fake_model.stats().chat_completions - served >= 4 + 3


# "gated" rows wait for a file: nothing past the first rows can finish before the kill.
GATED_MAIN = SCRIPTED_MAIN.replace(
    '        if kind == "hang":',
    '        while kind == "gated" and not Path(os.environ["GATE_FILE"]).exists():\n'
    "            await asyncio.sleep(0.05)\n"
    '        if kind == "hang":',
)


def test_a_killed_rollout_server_is_restarted_and_the_run_resumes(host_channel_server, tmp_path):
    pid_file, gate = tmp_path / "rollout.pid", tmp_path / "gate"
    rows = [row("pass", a, 7) for a in range(2, 6)] + [row("gated", a, 7) for a in range(6, 22)]
    repo = workspace(
        tmp_path,
        host_channel_server,
        rows,
        limit=20,
        batch_size=2,
        main=GATED_MAIN,
        env={"PID_FILE": str(pid_file), "GATE_FILE": str(gate), "MAX_CONCURRENT": "2"},
    )
    with host_channel_server.client() as client:
        created = submit(client, repo)
        recorded_at_least(client, created.id, 4)
        first_rollout = int(pid_file.read_text())
        os.kill(first_rollout, signal.SIGKILL)
        gate.touch()
        detail = finished(client, created.id)
        logs = "\n".join(all_logs(client, created.id))
    assert detail.eval_run.status == "finished", logs
    assert (detail.summary.passed, detail.summary.progress.completed) == (20, 20)
    assert "restarting rollout server scripted (restart 1 of 2 within 10 minutes)" in logs, logs
    assert "exited unexpectedly" in logs
    assert int(pid_file.read_text()) != first_rollout
    keys = [
        (e["row_index"], e["run_index"])
        for e in read_jsonl(run_dir(host_channel_server, created.id) / "events.jsonl")
    ]
    assert sorted(keys) == [(r, 0) for r in range(20)]  # each attempt exactly once


def test_a_rollout_server_that_keeps_dying_fails_the_run_saying_why(server, tmp_path):
    dying = SCRIPTED_MAIN.replace(
        '        if kind == "hang":',
        '        if kind == "die":\n            os._exit(3)\n        if kind == "hang":',
    )
    rows = [row("pass", 2, 2), row("pass", 3, 3), row("pass", 4, 4), row("die", 5, 5)]
    repo = workspace(tmp_path, server, rows, limit=4, batch_size=1, main=dying)
    with server.client() as client:
        created = submit(client, repo)
        detail = finished(client, created.id)
        attempts = client.runs.attempts(created.id).attempts
    assert detail.eval_run.status == "failed"
    assert detail.eval_run.error is not None
    assert "no rollout server left" in detail.eval_run.error
    assert "exited unexpectedly (code 3)" in detail.eval_run.error
    # The dying row is pending, never a zero: only the three passes are recorded.
    assert [(a.row_index, a.status, a.reward) for a in attempts] == [
        (0, "success", 1.0),
        (1, "success", 1.0),
        (2, "success", 1.0),
    ]
    assert detail.metrics is not None and detail.metrics["summary"]["total_samples"] == 3


def test_a_killed_server_leaves_no_process_behind_and_its_run_resumes(
    tmp_path, fake_model, databases
):
    # Unsandboxed: the test kills the rollout by the host pid it writes to PID_FILE.
    server = Server.start(
        tmp_path / "platform", fake_model, databases=databases, OSMOSIS_SANDBOX="off"
    )
    try:
        pid_file = tmp_path / "rollout.pid"
        rows = [row("pass", a, 7, sleep=0.3) for a in range(2, 32)]
        repo = make_repo(
            tmp_path / "ws",
            rows,
            limit=30,
            batch_size=2,
            env={"PID_FILE": str(pid_file), "MAX_CONCURRENT": "2"},
        )
        upload_dataset(server, repo)
        with server.client() as client:
            created = submit(client, repo)
            recorded_at_least(client, created.id, 6)
        workers = pids_of(created.id)
        rollout = int(pid_file.read_text())
        assert workers and rollout
        server.kill()
        assert gone_within(rollout, seconds=10), "the rollout server outlived the platform"
        assert all(gone_within(pid, seconds=10) for pid in workers), "a worker outlived it"
        journal = run_dir(server, created.id) / "events.jsonl"
        recorded_before = len(read_jsonl(journal))
        assert recorded_before < 30

        server.launch()
        with server.client() as client:
            recorded_at_least(client, created.id, recorded_before + 4)
        # A graceful stop leaves the run to resume too, and no process behind.
        workers, rollout = pids_of(created.id), int(pid_file.read_text())
        server.stop()
        assert gone_within(rollout, seconds=10) and all(gone_within(p, seconds=10) for p in workers)
        assert len(read_jsonl(journal)) < 30
        server.launch()
        with server.client() as client:
            detail = finished(client, created.id)
            attempts = client.runs.attempts(created.id, limit=200)
        assert detail.eval_run.status == "finished"
        assert (detail.summary.passed, detail.summary.progress.completed) == (30, 30)
        keys = [(e["row_index"], e["run_index"]) for e in read_jsonl(journal)]
        assert sorted(keys) == [(r, 0) for r in range(30)]  # no duplicates, no losses
        assert attempts.total_count == 30
        assert sorted((a.row_index, a.run_index) for a in attempts.attempts) == sorted(keys)
        assert detail.summary.resumed_count >= recorded_before
    finally:
        server.stop()
