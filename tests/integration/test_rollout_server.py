"""The rollout server's hot routes over real HTTP: they answer exactly as the FastAPI routes
behind them, a finished result is released soon after its controller read it, and a poll can
wait for the final answer instead of every status change."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from osmosis import AgentWorkflow, Grader, LocalBackend, create_rollout_server
from osmosis.eval.sites.rollout_client import RolloutClient
from osmosis.rollout.protocol import COLLECTED_HEADER, LEASE_HEADER, WAIT_HEADER, RolloutInitRequest
from tests.integration.conftest import serving
from tests.unit.rollout.test_server_routes import PassThrough

KEY = "server-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


class Answer(AgentWorkflow):
    """Sleeps as long as the row's metadata says, then answers "4"."""

    async def run(self, ctx):
        await asyncio.sleep(float((ctx.metadata or {}).get("sleep", 0)))
        return [*ctx.prompt, {"role": "assistant", "content": "4"}]


class Exact(Grader):
    async def grade(self, ctx):
        await asyncio.sleep(float((ctx.metadata or {}).get("grade_sleep", 0)))
        ctx.set_reward(1.0 if ctx.sample.messages[-1]["content"] == ctx.label else 0.0)


def body(rollout_id: str, **metadata: float) -> dict[str, Any]:
    return {
        "rollout_id": rollout_id,
        "initial_messages": [{"role": "user", "content": "What is 2 + 2?"}],
        "label": "4",
        "metadata": metadata or None,
        "chat_completions_url": "http://127.0.0.1:9/v1",
    }


@contextmanager
def server(
    tmp_path, *, framework: bool = False, max_pending: int = 2, **options: Any
) -> Iterator[httpx.Client]:
    backend = LocalBackend(
        workflow=Answer,
        grader=Exact,
        artifact_root=tmp_path / uuid.uuid4().hex,
        max_pending=max_pending,
    )
    app = create_rollout_server(backend=backend, configure_logging=False, **options)
    if framework:
        app.add_middleware(PassThrough)
    with serving(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client


def admit(client: httpx.Client, rollout_id: str, **metadata: float) -> str:
    accepted = client.post("/rollout", json=body(rollout_id, **metadata), headers=AUTH)
    assert accepted.status_code == 202, accepted.text
    return str(accepted.json()["polling_lease_token"])


def poll(client: httpx.Client, rollout_id: str, lease: str, **headers: str) -> httpx.Response:
    return client.get(
        f"/rollout/{rollout_id}/result", headers={**AUTH, LEASE_HEADER: lease, **headers}
    )


def final(client: httpx.Client, rollout_id: str, lease: str) -> httpx.Response:
    while True:
        response = poll(client, rollout_id, lease)
        if response.status_code != 200 or response.json()["status"] in ("success", "failure"):
            return response


def exchanges(client: httpx.Client) -> list[tuple[int, Any, str | None]]:
    """The same requests against one server: (status, body with ids and leases blanked,
    Retry-After) for each, covering every answer of the two hot routes."""
    seen: list[tuple[int, Any, str | None]] = []

    def note(response: httpx.Response) -> None:
        payload = response.json()
        if isinstance(payload, dict):
            for key in ("rollout_id", "polling_lease_token"):
                if key in payload:
                    payload[key] = "*"
        seen.append((response.status_code, payload, response.headers.get("retry-after")))

    rid = uuid.uuid4().hex
    note(client.post("/rollout", json=body(rid), headers=AUTH))
    note(client.post("/rollout", json=body(rid), headers=AUTH))  # duplicate: 409
    note(client.post("/rollout", json={**body("a/b")}, headers=AUTH))  # 422, FastAPI's shape
    note(client.post("/rollout", json={"rollout_id": "x"}, headers=AUTH))  # 422: missing fields
    note(client.post("/rollout", content=b"{not json", headers=AUTH))
    note(
        client.post("/rollout", content=b"rollout", headers={**AUTH, "content-type": "text/plain"})
    )
    note(client.post("/rollout", json=body(uuid.uuid4().hex)))  # no bearer token: 401
    slow = uuid.uuid4().hex
    lease = admit(client, slow, sleep=0.5)
    admit(client, uuid.uuid4().hex, sleep=0.5)
    note(client.post("/rollout", json=body(uuid.uuid4().hex), headers=AUTH))  # 2 pending: 429
    note(client.get(f"/rollout/{slow}/result", headers=AUTH))  # no lease header: 422
    note(poll(client, slow, ""))  # empty lease: 422
    note(poll(client, slow, "not-the-lease"))  # 403
    note(poll(client, uuid.uuid4().hex, lease))  # 404
    note(client.get(f"/rollout/{slow}/result", headers={LEASE_HEADER: lease}))  # 401
    note(final(client, slow, lease))
    note(poll(client, slow, lease))  # a finished result, read again
    return seen


def test_the_hot_routes_answer_exactly_as_the_fastapi_routes(tmp_path) -> None:
    with server(tmp_path, api_key=KEY) as hot, server(tmp_path, api_key=KEY, framework=True) as api:
        fast, reference = exchanges(hot), exchanges(api)

    assert fast == reference
    statuses = [status for status, _, _ in fast]
    assert statuses == [202, 409, 422, 422, 422, 422, 401, 429, 422, 422, 403, 404, 401, 200, 200]
    assert fast[7][2] == "5"  # 429 carries Retry-After
    assert fast[-1][1]["sample"]["reward"] == 1.0


def test_a_result_its_controller_read_is_released_after_the_short_retention(tmp_path) -> None:
    with server(tmp_path, result_retention_sec=60.0, collected_result_retention_sec=0.5) as client:
        read, unread = uuid.uuid4().hex, uuid.uuid4().hex
        read_lease, unread_lease = admit(client, read), admit(client, unread)
        first = final(client, read, read_lease)
        assert first.json()["status"] == "success"
        # A re-read right away (a controller whose first answer was lost) gets the same bytes.
        assert poll(client, read, read_lease).content == first.content

        time.sleep(1.5)

        assert poll(client, read, read_lease).status_code == 404
        # A result nobody read yet keeps its full retention.
        kept = poll(client, unread, unread_lease)
        assert kept.status_code == 200
        assert kept.json()["sample"]["reward"] == 1.0
        # A released id may be admitted again.
        admit(client, read)


@pytest.mark.parametrize("framework", [False, True], ids=["hot", "fastapi"])
def test_results_the_controller_says_it_holds_are_forgotten_at_once(tmp_path, framework) -> None:
    with server(tmp_path, framework=framework, max_pending=8, result_retention_sec=60.0) as client:
        held, kept, unread, running = (uuid.uuid4().hex for _ in range(4))
        leases = {rid: admit(client, rid) for rid in (held, kept, unread)}
        for rid in (held, kept):
            assert final(client, rid, leases[rid]).json()["status"] == "success"
        leases[running] = admit(client, running, sleep=1.0)
        told = ",".join([held, unread, running, "never-admitted"])
        accepted = client.post(
            "/rollout", json=body(uuid.uuid4().hex), headers={**AUTH, COLLECTED_HEADER: told}
        )
        assert accepted.status_code == 202, accepted.text

        assert poll(client, held, leases[held]).status_code == 404  # no 10 s re-read window
        assert poll(client, kept, leases[kept]).json()["status"] == "success"  # not named
        # Named but never read, or still running: the controller cannot hold those yet.
        assert poll(client, unread, leases[unread]).json()["status"] == "success"
        assert final(client, running, leases[running]).json()["status"] == "success"


def test_the_engines_client_tells_the_server_which_results_it_has(tmp_path) -> None:
    async def three_attempts(url: str) -> list[str]:
        ids = [uuid.uuid4().hex for _ in range(3)]
        async with RolloutClient(url) as rollouts:
            for rid in ids:
                request = RolloutInitRequest.model_validate(body(rid))
                result = await rollouts.wait(await rollouts.start(request), deadline_sec=30)
                assert result.status.value == "success"
        return ids

    backend = LocalBackend(workflow=Answer, grader=Exact, artifact_root=tmp_path / "artifacts")
    app = create_rollout_server(backend=backend, configure_logging=False)
    with serving(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        first, second, last = asyncio.run(three_attempts(url))
        lease = {LEASE_HEADER: "wrong"}
        # Each admission named the result before it: gone (404, not a lease error: 403).
        assert client.get(f"/rollout/{first}/result", headers=lease).status_code == 404
        assert client.get(f"/rollout/{second}/result", headers=lease).status_code == 404
        # Nothing came after the last one: it keeps the re-read window.
        assert client.get(f"/rollout/{last}/result", headers=lease).status_code == 403


@pytest.mark.parametrize("framework", [False, True], ids=["hot", "fastapi"])
@pytest.mark.parametrize("terminal", [True, False])
def test_a_poll_can_wait_for_the_final_answer_instead_of_each_status_change(
    tmp_path, terminal: bool, framework: bool
) -> None:
    headers = {WAIT_HEADER: "terminal"} if terminal else {}
    with server(tmp_path, framework=framework, result_wait_timeout_sec=10.0) as client:
        rid = uuid.uuid4().hex
        lease = admit(client, rid, sleep=0.4, grade_sleep=0.4)

        answers = []
        while not answers or answers[-1] not in ("success", "failure"):
            answers.append(poll(client, rid, lease, **headers).json()["status"])

    if terminal:
        assert answers == ["success"]
    else:  # every change answers the poll: running (or queued), then grading, then the end
        assert len(answers) >= 2
        assert "grading" in answers
        assert answers[-1] == "success"
