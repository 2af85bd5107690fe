"""The Stop button on a really running run: a platform process with its scheduler, a worker,
the scripted rollout (rows that hang) and the scripted model. The page refreshes itself until
the worker has written what finished and marked the run stopped."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import expect

from osmosis.testing import FakeModelServer
from tests.e2e.workspace import row
from tests.platform.databases import Databases
from tests.platform.eval_world import (
    Server,
    finished,
    make_repo,
    submit,
    upload_dataset,
    wait_for,
)
from tests.web.conftest import sign_in

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROWS = [row("pass", 2, 3), row("pass", 3, 3), row("hang"), row("hang"), row("hang")]


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, module_databases: Databases
) -> Iterator[Server]:
    with FakeModelServer() as model:
        platform = Server.start(
            tmp_path_factory.mktemp("platform"), model, databases=module_databases
        )
        yield platform
        platform.stop()


def test_the_stop_button_stops_a_running_run(server: Server, page, tmp_path):
    repo = make_repo(tmp_path / "repo", ROWS, limit=5, batch_size=5, agent_timeout=600)
    upload_dataset(server, repo)
    with server.client() as client:
        created = submit(client, repo)
        wait_for(
            client,
            created.name,
            lambda d: d.eval_run.status == "running" and d.summary.progress.completed >= 2,
            what="two attempts recorded while three hang",
        )
        sign_in(page, server.url, server.admin_token)
        page.goto(f"{server.url}/runs/{created.name}")
        assert "running" in page.inner_text("#status")
        assert page.inner_text("#progress").startswith("2/5 samples")
        assert "so far" in page.inner_text("#sidebar")  # the duration counts while it runs
        page.screenshot(path=str(tmp_path / "run-running.png"), full_page=True)

        page.click("#stop-form button")
        page.wait_for_url(f"{server.url}/runs/{created.name}")
        # No reload by hand: live refresh swaps in the new status when the worker is done.
        expect(page.locator("#status")).to_contain_text("stopped", timeout=60_000)
        assert page.locator("#stop-form").count() == 0
        page.screenshot(path=str(tmp_path / "run-stopped.png"), full_page=True)

        detail = finished(client, created.name)
        assert detail.eval_run.status == "stopped"
        assert detail.summary.progress.completed == 2  # what finished is kept
