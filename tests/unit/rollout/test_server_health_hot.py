"""`GET /health` on the hot path: the same answer FastAPI gives, without FastAPI's first-request
cost (reading the endpoint's source for its error messages), which the engine's readiness
check used to wait for on every rollout server start."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from fastapi.routing import APIRoute

from tests.unit.rollout.test_server_routes import client, rollout_app

HEALTH_HEADERS = (
    "content-type",
    "x-osmosis-rollout-instance-id",
    "x-osmosis-rollout-sdk-version",
    "x-osmosis-rollout-shutdown",
)


async def test_the_hot_health_answer_is_the_fastapi_routes_answer(tmp_path) -> None:
    app = rollout_app(tmp_path)
    route = next(r for r in app.routes if isinstance(r, APIRoute) and r.path == "/health")
    async with client(app) as http:
        served = await http.get("/health")
    declared = await route.endpoint()  # what the FastAPI route answers, in the same app
    assert served.status_code == declared.status_code == 200
    assert served.content == declared.body  # byte for byte: compact JSON, as FastAPI writes
    assert served.json()["lifecycle"] == {"accepting_rollouts": True, "active_rollouts": 0}
    for name in (*HEALTH_HEADERS, "content-length"):
        assert served.headers[name] == declared.headers[name], name
    assert served.headers["x-osmosis-rollout-shutdown"] == "none"


@pytest.mark.parametrize("authorization", [None, "Bearer wrong"], ids=["missing", "wrong"])
async def test_the_hot_health_route_still_requires_the_bearer_token(
    tmp_path, authorization
) -> None:
    headers = {"Authorization": authorization} if authorization else {}
    async with client(rollout_app(tmp_path, api_key="k1")) as http:
        refused = await http.get("/health", headers=headers)
        allowed = await http.get("/health", headers={"Authorization": "Bearer k1"})
    assert (refused.status_code, refused.json()) == (401, {"detail": "unauthorized"})
    assert allowed.status_code == 200 and allowed.json()["status"] == "ok"


HEALTH_ONLY = textwrap.dedent(
    """
    import asyncio, json, linecache, sys
    import httpx
    from osmosis import AgentWorkflow, Grader, LocalBackend, create_rollout_server

    class Answer(AgentWorkflow):
        async def run(self, ctx):
            return ctx.prompt

    class Exact(Grader):
        async def grade(self, ctx):
            ctx.set_reward(1.0)

    async def main():
        app = create_rollout_server(
            backend=LocalBackend(workflow=Answer, grader=Exact), configure_logging=False
        )
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://rollout") as http:
            answers = [(await http.get("/health")).status_code for _ in range(3)]
        read = sorted(name for name in linecache.cache if "osmosis" in name)
        print(json.dumps({"answers": answers, "sources_read": read}))

    asyncio.run(main())
    """
)


def test_health_checks_do_not_read_the_servers_source() -> None:
    # A fresh interpreter: FastAPI reads an endpoint's source (linecache) on its first request.
    done = subprocess.run(
        [sys.executable, "-c", HEALTH_ONLY], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen == {"answers": [200, 200, 200], "sources_read": []}
