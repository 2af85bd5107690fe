"""Fair scheduling (issue 25.7): the platform caps the rollout and grader timeouts a config may
set, a user's runs beyond their share of the run slots wait while another user's run does, and
a pending run says why it waits. A real server process with worker processes, two users, the
scripted model; driven over HTTP through the typed client, on SQLite and on PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from osmosis.client import PlatformAPIError
from osmosis.testing import FakeModelServer
from tests.e2e.workspace import SCRIPTED_MAIN, row
from tests.platform.conftest import osmosis
from tests.platform.eval_world import Server, finished, make_repo, submit, upload_dataset, wait_for

pytestmark = pytest.mark.slow

# The scripted rollout, hanging in every attempt when the config's [env] says HANG.
HANGING_MAIN = SCRIPTED_MAIN.replace(
    'if kind == "hang":', 'if kind == "hang" or os.environ.get("HANG"):'
)
FOUR_PASSING = [row("pass", a, 3) for a in range(2, 6)]


@pytest.fixture(scope="module")
def fake_model() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


def test_one_users_hung_runs_leave_the_next_slot_to_another_user_who_is_told_why_they_wait(
    tmp_path, fake_model, databases
):
    assert HANGING_MAIN != SCRIPTED_MAIN
    server = Server.start(
        tmp_path / "platform",
        fake_model,
        databases=databases,
        OSMOSIS_MAX_CONCURRENT_RUNS="2",
        OSMOSIS_RUNS_PER_USER="1",
        OSMOSIS_MAX_AGENT_WORKFLOW_TIMEOUT_S="60",
    )
    try:
        repo = make_repo(tmp_path / "ws", FOUR_PASSING, limit=4, main=HANGING_MAIN)
        upload_dataset(server, repo)
        text = repo.config.read_text()
        assert "agent_workflow_timeout_s = 30" in text and "grader_timeout_s = 30" in text
        with server.client() as ada:
            # Above the caps: refused at submit, each cap named, nothing queued.
            too_long = text.replace(
                "agent_workflow_timeout_s = 30", "agent_workflow_timeout_s = 61"
            )
            too_long = too_long.replace("grader_timeout_s = 30", "grader_timeout_s = 901")
            with pytest.raises(PlatformAPIError) as refused:
                submit(ada, repo, config_text=too_long)
            assert (refused.value.status_code, refused.value.code) == (422, "VALIDATION")
            message = refused.value.message
            assert (
                "evaluation.agent_workflow_timeout_s: 61 s is above this platform's cap of 60 s"
                in message
            )
            assert "OSMOSIS_MAX_AGENT_WORKFLOW_TIMEOUT_S" in message
            assert (
                "evaluation.grader_timeout_s: 901 s is above this platform's cap of 900 s"
                in message
            )
            assert "OSMOSIS_MAX_GRADER_TIMEOUT_S" in message
            assert ada.runs.list(git=repo.git).total_count == 0

            # Ada's hung runs (their rollouts sleep; 55 s deadlines, under the cap): alone, she
            # takes both slots, and her third run waits behind her own.
            hung = text.replace("agent_workflow_timeout_s = 30", "agent_workflow_timeout_s = 55")
            hung = hung.replace("[secrets]", '[env]\nHANG = "1"\n\n[secrets]')
            first, second, third = (submit(ada, repo, config_text=hung) for _ in range(3))
            for run in (first, second):
                wait_for(ada, run.id, lambda d: d.eval_run.status == "running", what="running")
            waiting = ada.runs.get(third.id).eval_run
            assert waiting.status == "pending"
            assert waiting.waiting_reason is not None
            assert waiting.waiting_reason.startswith("2 of 2 run slots held by your other runs")
            shown = osmosis("eval", "info", third.name, env={**server.env, "COLUMNS": "200"})
            assert shown.returncode == 0, shown.stderr
            assert "2 of 2 run slots held by your other runs" in shown.stdout
            assert ada.runs.get(first.id).eval_run.waiting_reason is None

            user = ada.admin.create_user(name="bea", email="bea@example.com")
            ada.workspaces.add_member(git=repo.git, email="bea@example.com")
            with server.client(user.token.token) as bea:
                theirs = submit(bea, repo)
                pending = bea.runs.get(theirs.id).eval_run
                assert pending.status == "pending"
                assert pending.waiting_reason is not None
                assert pending.waiting_reason.startswith(
                    "2 of 2 run slots held by other users' runs"
                )

                # A slot frees: it goes to Bea's run, within her share, not to Ada's older one.
                ada.runs.stop(first.id)
                done = finished(bea, theirs.id)
                assert done.eval_run.status == "finished", done.eval_run.error
                assert done.summary.passed == 4
            later = ada.runs.get(third.id).eval_run
            assert done.eval_run.started_at is not None
            assert later.started_at is None or later.started_at > done.eval_run.started_at
            assert ada.runs.get(second.id).eval_run.status == "running"  # still hung
            for run in (second, third):
                ada.runs.stop(run.id)
    finally:
        server.stop()
