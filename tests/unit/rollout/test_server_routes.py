"""The rollout server's FastAPI routes behind the hot path: declared with typed parameters only
when a request first needs them (a start spends ~35 ms less CPU), answering exactly as FastAPI
does, and described in the OpenAPI document as typed routes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from osmosis import AgentWorkflow, Grader, LocalBackend, create_rollout_server
from osmosis.rollout.protocol import LEASE_HEADER

ROLLOUT = {
    "rollout_id": "r1",
    "initial_messages": [{"role": "user", "content": "What is 2 + 2?"}],
    "label": "4",
    "chat_completions_url": "http://127.0.0.1:9/v1",
}
ONE_SELECTOR = {"detail": "pass exactly one selector: ids, prefix, or all"}


class Answer(AgentWorkflow):
    async def run(self, ctx):
        return [*ctx.prompt, {"role": "assistant", "content": "4"}]


class Exact(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0 if ctx.sample.messages[-1]["content"] == ctx.label else 0.0)


class PassThrough:
    """A user's own ASGI middleware: with one present, FastAPI serves every request."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


def rollout_app(tmp_path, *, middleware: bool = False, **options: Any) -> FastAPI:
    backend = LocalBackend(workflow=Answer, grader=Exact, artifact_root=tmp_path)
    app = create_rollout_server(backend=backend, configure_logging=False, **options)
    if middleware:
        app.add_middleware(PassThrough)
    return app


def client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://rollout")


def missing(*loc: str | int) -> dict[str, Any]:
    return {"type": "missing", "loc": list(loc), "msg": "Field required"}


NOT_AN_OBJECT = {
    "type": "model_attributes_type",
    "loc": ["body"],
    "msg": "Input should be a valid dictionary or object to extract fields from",
}

# Every answer the routes give off the hot path, as FastAPI gave them when the routes were
# declared at start: (method, path, headers, body, status, JSON answer).
OFF_THE_HOT_PATH = {
    "rollout_id with a slash": (
        "POST", "/rollout", {}, {**ROLLOUT, "rollout_id": "a/b"}, 422,
        {"detail": [{"type": "value_error", "loc": ["body", "rollout_id"], "msg": (
            "Value error, rollout_id must be a single path segment (no '/', '\\', '.' or '..')"
        )}]},
    ),
    "fields missing": (
        "POST", "/rollout", {}, {"rollout_id": "x"}, 422,
        {"detail": [missing("body", "initial_messages"), missing("body", "chat_completions_url")]},
    ),
    "not JSON": (
        "POST", "/rollout", {"content-type": "application/json"}, b"{not json", 422,
        {"detail": [{"type": "json_invalid", "loc": ["body", 1], "msg": "JSON decode error"}]},
    ),
    "text/plain": (
        "POST", "/rollout", {"content-type": "text/plain"}, b"rollout", 422,
        {"detail": [NOT_AN_OBJECT]},
    ),
    "no body": ("POST", "/rollout", {}, b"", 422, {"detail": [missing("body")]}),
    "non-finite timeout": (
        "POST", "/rollout", {"content-type": "application/json"},
        json.dumps({**ROLLOUT, "agent_timeout_sec": 0.5}).replace("0.5", "1e999").encode(), 422,
        {"detail": [{"type": "value_error", "loc": ["body", "agent_timeout_sec"],
                     "msg": "Value error, timeout must be finite; omit it to run unbounded"}]},
    ),
    "no lease header": (
        "GET", "/rollout/r9/result", {}, b"", 422,
        {"detail": [missing("header", LEASE_HEADER)]},
    ),
    "empty lease": (
        "GET", "/rollout/r9/result", {LEASE_HEADER: ""}, b"", 422,
        {"detail": [{"type": "string_too_short", "loc": ["header", LEASE_HEADER],
                     "msg": "String should have at least 1 character"}]},
    ),
    "unknown rollout": (
        "GET", "/rollout/r9/result", {LEASE_HEADER: "lease"}, b"", 404,
        {"detail": "unknown rollout_id"},
    ),
    "cancel, no selector": ("POST", "/rollout/cancel", {}, {}, 422, ONE_SELECTOR),
    "cancel, two selectors": (
        "POST", "/rollout/cancel", {}, {"ids": ["a"], "all": True}, 422, ONE_SELECTOR
    ),
    "cancel, ids not a list": (
        "POST", "/rollout/cancel", {}, {"ids": 5}, 422,
        {"detail": [{"type": "list_type", "loc": ["body", "ids"],
                     "msg": "Input should be a valid list"}]},
    ),
    "cancel, unknown id": (
        "POST", "/rollout/cancel", {}, {"ids": ["nope"]}, 200,
        {"dispositions": {"nope": "not_found"}},
    ),
    "cancel, no content type": (
        "POST", "/rollout/cancel", {}, b'{"prefix": "zz"}', 422, {"detail": [NOT_AN_OBJECT]},
    ),
}  # fmt: skip


@pytest.mark.parametrize("middleware", [False, True], ids=["hot path first", "user middleware"])
@pytest.mark.parametrize(
    ("method", "path", "headers", "body", "status", "answer"),
    list(OFF_THE_HOT_PATH.values()),
    ids=list(OFF_THE_HOT_PATH),
)
async def test_requests_off_the_hot_path_get_fastapis_answers(
    tmp_path, middleware, method, path, headers, body, status, answer
) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    if not isinstance(body, bytes):
        headers = {**headers, "content-type": "application/json"}
    async with client(rollout_app(tmp_path, middleware=middleware)) as http:
        response = await http.request(method, path, headers=headers, content=content)
    assert (response.status_code, response.json()) == (status, answer)
    assert response.headers["content-type"] == "application/json"


async def test_a_rollout_served_entirely_by_fastapi_runs_to_its_result(tmp_path) -> None:
    async with client(rollout_app(tmp_path, middleware=True)) as http:
        accepted = await http.post("/rollout", json=ROLLOUT)
        assert accepted.status_code == 202
        assert accepted.json()["status"] == "queued"
        lease = accepted.json()["polling_lease_token"]
        wait = {LEASE_HEADER: lease, "X-Osmosis-Rollout-Wait": "terminal"}
        result = await http.get("/rollout/r1/result", headers=wait)
        cancelled = await http.post("/rollout/cancel", json={"all": True})
    assert result.status_code == 200
    assert (result.json()["status"], result.json()["sample"]["reward"]) == ("success", 1.0)
    assert cancelled.json() == {"dispositions": {"r1": "not_found"}}  # finished already


async def test_a_wrong_method_is_405_with_allow(tmp_path) -> None:
    async with client(rollout_app(tmp_path)) as http:
        response = await http.get("/rollout/cancel")
    assert (response.status_code, response.json()) == (405, {"detail": "Method Not Allowed"})
    assert response.headers["allow"] == "POST"


async def test_the_users_exception_handlers_answer_for_the_protocol_routes(tmp_path) -> None:
    app = rollout_app(tmp_path)

    async def own_shape(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return JSONResponse({"problems": len(exc.errors())}, status_code=400)

    app.add_exception_handler(RequestValidationError, own_shape)
    async with client(app) as http:
        response = await http.get("/rollout/r9/result")
    assert (response.status_code, response.json()) == (400, {"problems": 1})


async def test_a_missing_bearer_token_is_401_before_any_route(tmp_path) -> None:
    async with client(rollout_app(tmp_path, api_key="key")) as http:
        refused = await http.post("/rollout/cancel", json={"all": True})
        answered = await http.post(
            "/rollout/cancel", json={"all": True}, headers={"Authorization": "Bearer key"}
        )
    assert (refused.status_code, refused.json()) == (401, {"detail": "unauthorized"})
    assert answered.status_code == 200


def typed_reference(app: FastAPI) -> FastAPI:
    """A plain FastAPI app whose protocol routes are the typed ones, declared up front."""
    reference = FastAPI(title=app.title, version=app.version, docs_url=None, redoc_url=None)
    reference.router.routes += [r for r in app.routes if getattr(r, "path", "") == "/health"]
    reference.include_router(app.protocol.router())
    return reference


async def test_the_openapi_document_describes_the_typed_routes(tmp_path) -> None:
    app = rollout_app(tmp_path)
    async with client(app) as http:
        document = (await http.get("/openapi.json")).json()

    start = document["paths"]["/rollout"]["post"]
    assert start["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/RolloutInitRequest"
    }
    assert [p["name"] for p in start["parameters"]] == [
        "X-Osmosis-Rollout-Trajectory",
        "X-Osmosis-Rollout-Collected",
    ]
    assert set(start["responses"]) == {"202", "422"}
    poll = document["paths"]["/rollout/{rollout_id}/result"]["get"]
    assert [(p["name"], p["in"], p["required"]) for p in poll["parameters"]] == [
        ("rollout_id", "path", True),
        (LEASE_HEADER, "header", True),
        ("X-Osmosis-Rollout-Wait", "header", False),
    ]
    assert sorted(document["components"]["schemas"]) == [
        "CancelRolloutsRequest",
        "CancelRolloutsResponse",
        "HTTPValidationError",
        "RolloutInitRequest",
        "RolloutInitResponse",
        "RolloutStatus",
        "ValidationError",
    ]
    assert document == typed_reference(app).openapi()


async def test_routes_a_user_adds_join_the_openapi_document(tmp_path) -> None:
    app = rollout_app(tmp_path)

    @app.get("/mine/{item}")
    async def mine(item: int, token: str = Header()) -> dict[str, int]:
        return {"item": item}

    async with client(app) as http:
        document = (await http.get("/openapi.json")).json()
        assert (await http.get("/mine/3", headers={"token": "t"})).json() == {"item": 3}
    assert list(document["paths"]) == [
        "/health",
        "/rollout",
        "/rollout/{rollout_id}/result",
        "/rollout/cancel",
        "/mine/{item}",
    ]
    assert document["paths"]["/rollout"]["post"]["operationId"] == "start_rollout_rollout_post"
    assert [p["name"] for p in document["paths"]["/mine/{item}"]["get"]["parameters"]] == [
        "item",
        "token",
    ]
    assert document == app.openapi()  # kept, not rebuilt


START = textwrap.dedent(
    """
    import asyncio, json, sys, tempfile
    import httpx
    from osmosis import AgentWorkflow, Grader, LocalBackend, create_rollout_server

    class Answer(AgentWorkflow):
        async def run(self, ctx):
            return [*ctx.prompt, {"role": "assistant", "content": "4"}]

    class Exact(Grader):
        async def grade(self, ctx):
            ctx.set_reward(1.0)

    async def main():
        backend = LocalBackend(workflow=Answer, grader=Exact, artifact_root=tempfile.mkdtemp())
        app = create_rollout_server(backend=backend, configure_logging=False)
        seen = {"started": "pydantic.v1" in sys.modules}
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://rollout") as http:
            health = await http.get("/health")
            accepted = await http.post("/rollout", json=json.loads(sys.argv[1]))
            lease = accepted.json()["polling_lease_token"]
            wait = {"X-Osmosis-Rollout-Lease": lease, "X-Osmosis-Rollout-Wait": "terminal"}
            result = await http.get("/rollout/r1/result", headers=wait)
            seen["served"] = "pydantic.v1" in sys.modules
            seen["answers"] = [health.status_code, accepted.status_code, result.json()["status"]]
            no_lease = await http.get("/rollout/r1/result")
            seen["off_path"] = [no_lease.status_code, "pydantic.v1" in sys.modules]
        print(json.dumps(seen))

    asyncio.run(main())
    """
)


def test_a_server_declares_its_typed_routes_only_when_a_request_needs_them() -> None:
    # A fresh interpreter: this one has long since imported pydantic.v1 for other apps.
    done = subprocess.run(
        [sys.executable, "-c", START, json.dumps(ROLLOUT)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    # FastAPI imports pydantic.v1 (~20 ms) to declare any route with a typed parameter.
    assert (seen["started"], seen["served"]) == (False, False)
    assert seen["answers"] == [200, 202, "success"]
    assert seen["off_path"] == [422, True]
