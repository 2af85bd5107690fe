"""The rollout server without FastAPI: a process that serves rollouts end to end never imports
it; the first request off the common path, or the user's code using the app as a FastAPI app,
builds it, and from then on it answers as before (issue 30)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from osmosis import LocalBackend, create_rollout_server
from osmosis.rollout.protocol import LEASE_HEADER, WAIT_HEADER
from tests.integration.conftest import serving
from tests.integration.test_rollout_server import Answer, Exact, body

# A rollout server as a user writes one, served by uvicorn in its own interpreter. Its health
# document says whether FastAPI is loaded (a probe that is no route of its own); its lifespan
# prints each of its steps. argv: the socket's file descriptor, then options.
SERVER = textwrap.dedent(
    """
    import contextlib, socket, sys
    import uvicorn
    from osmosis import AgentWorkflow, Grader, LocalBackend, create_rollout_server

    class Answer(AgentWorkflow):
        async def run(self, ctx):
            return [*ctx.prompt, {"role": "assistant", "content": "4"}]

    class Exact(Grader):
        async def grade(self, ctx):
            ctx.set_reward(1.0)

    class Probed(LocalBackend):
        def health(self):
            return {**super().health(), "fastapi_loaded": "fastapi" in sys.modules}

    @contextlib.asynccontextmanager
    async def lifespan(app):
        print("startup", flush=True)
        if "fail" in sys.argv:
            raise RuntimeError("the database is down")
        yield
        print("shutdown", flush=True)

    app = create_rollout_server(
        backend=Probed(workflow=Answer, grader=Exact), lifespan=lifespan, configure_logging=False
    )
    if "route" in sys.argv:
        @app.get("/custom")
        async def custom():
            return {"custom": True}

    sock = socket.socket(fileno=int(sys.argv[1]))
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
    """
)


@contextmanager
def server_process(*options: str) -> Iterator[tuple[httpx.Client, subprocess.Popen[str]]]:
    """The SERVER script on a loopback socket this process bound (no port race)."""
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    process = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(sock.fileno()), *options],
        pass_fds=[sock.fileno()],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    sock.close()
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            yield client, process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)


def stop(process: subprocess.Popen[str]) -> tuple[list[str], str]:
    """Stop the server as the engine does: its printed lines and its log."""
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=30)
    assert process.returncode == -signal.SIGTERM, err  # uvicorn raises the signal it caught again
    return out.split(), err


def fastapi_loaded(client: httpx.Client) -> bool:
    health = client.get("/health")
    assert health.status_code == 200
    return bool(health.json()["fastapi_loaded"])


def run_one(client: httpx.Client) -> dict[str, Any]:
    rid = uuid.uuid4().hex
    accepted = client.post("/rollout", json=body(rid))
    assert accepted.status_code == 202, accepted.text
    lease = accepted.json()["polling_lease_token"]
    result = client.get(
        f"/rollout/{rid}/result", headers={LEASE_HEADER: lease, WAIT_HEADER: "terminal"}
    )
    assert result.status_code == 200
    return dict(result.json())


def test_a_server_process_serves_rollouts_end_to_end_without_importing_fastapi() -> None:
    with server_process() as (client, process):
        assert fastapi_loaded(client) is False
        assert run_one(client)["sample"]["reward"] == 1.0
        held = client.post("/rollout", json=body("held"), headers={WAIT_HEADER: "terminal"})
        assert held.json()["status"] == "success"
        cancelled = client.post("/rollout/cancel", json={"all": True})
        assert cancelled.json()["dispositions"]["held"] == "not_found"  # finished already
        assert fastapi_loaded(client) is False

        # Off the common path: FastAPI is built and answers as it did, in its shape.
        invalid = client.post("/rollout", json={"rollout_id": "x"})
        assert invalid.status_code == 422
        assert [error["loc"] for error in invalid.json()["detail"]] == [
            ["body", "initial_messages"],
            ["body", "chat_completions_url"],
        ]
        assert fastapi_loaded(client) is True
        document = client.get("/openapi.json").json()
        assert list(document["paths"]) == [
            "/health",
            "/rollout",
            "/rollout/{rollout_id}/result",
            "/rollout/cancel",
        ]
        assert "RolloutInitRequest" in document["components"]["schemas"]
        assert run_one(client)["status"] == "success"  # the hot path, behind FastAPI now
        printed, _ = stop(process)
    # Started without FastAPI, built mid-run: the lifespan ran once each way all the same.
    assert printed == ["startup", "shutdown"]


def test_a_user_route_builds_fastapi_before_the_start_and_its_lifespan_runs_once() -> None:
    with server_process("route") as (client, process):
        assert client.get("/custom").json() == {"custom": True}
        assert fastapi_loaded(client) is True
        assert run_one(client)["status"] == "success"
        printed, _ = stop(process)
    assert printed == ["startup", "shutdown"]


@pytest.mark.parametrize("options", [(), ("route",)], ids=["without fastapi", "fastapi built"])
def test_a_lifespan_that_fails_to_start_stops_uvicorn_as_starlette_would(options) -> None:
    with server_process("fail", *options) as (_, process):
        out, err = process.communicate(timeout=30)
    assert process.returncode == 3  # uvicorn's "Application startup failed"
    assert out.split() == ["startup"]
    assert "RuntimeError: the database is down" in err
    assert "Application startup failed. Exiting." in err


class SeeingEverything:
    """A user's ASGI middleware: notes every request's path."""

    def __init__(self, app: Any, seen: list[str]) -> None:
        self.app = app
        self.seen = seen

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.seen.append(scope["path"])
        await self.app(scope, receive, send)


def test_a_users_middleware_sees_every_request(tmp_path) -> None:
    seen: list[str] = []
    app = create_rollout_server(
        backend=LocalBackend(workflow=Answer, grader=Exact, artifact_root=tmp_path),
        configure_logging=False,
    )
    app.add_middleware(SeeingEverything, seen=seen)
    with serving(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        assert client.get("/health").status_code == 200
        result = run_one(client)
        assert client.post("/rollout/cancel", json={"all": True}).status_code == 200
    rid = result["rollout_id"]
    assert seen == ["/health", "/rollout", f"/rollout/{rid}/result", "/rollout/cancel"]


def test_the_app_forwards_fastapis_api_and_says_it_is_no_fastapi_instance(tmp_path) -> None:
    app = create_rollout_server(
        backend=LocalBackend(workflow=Answer, grader=Exact, artifact_root=tmp_path),
        configure_logging=False,
    )
    assert app._app is None  # nothing built yet
    app.state.pool = "pool"  # attribute access, then assignment, on FastAPI's objects
    app.title = "mine"
    built = app.fastapi_app()
    assert isinstance(built, FastAPI) and not isinstance(app, FastAPI)
    assert (built.state.pool, built.title, app.openapi()["info"]["title"]) == (
        "pool",
        "mine",
        "mine",
    )
    assert app.routes is built.routes
    with pytest.raises(AttributeError):
        app.no_such_thing  # noqa: B018


@asynccontextmanager
async def counted(app: Any, events: list[str]) -> AsyncIterator[None]:
    events.append("startup")
    yield
    events.append("shutdown")


@pytest.mark.parametrize("built", ["never", "mid-run", "before the start"])
def test_the_lifespan_runs_once_each_way_whenever_fastapi_is_built(tmp_path, built) -> None:
    events: list[str] = []
    app = create_rollout_server(
        backend=LocalBackend(workflow=Answer, grader=Exact, artifact_root=tmp_path),
        configure_logging=False,
        lifespan=lambda app: counted(app, events),
    )
    if built == "before the start":
        app.fastapi_app()
    with serving(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        assert events == ["startup"]
        if built == "mid-run":
            assert client.get("/nowhere").status_code == 404  # FastAPI's answer: built now
        assert (app._app is None) == (built == "never")
        assert run_one(client)["status"] == "success"
    assert events == ["startup", "shutdown"]


def test_a_valid_cancel_on_the_hot_path_is_fastapis_answer_byte_for_byte(tmp_path) -> None:
    def answers(framework: bool) -> list[tuple[int, bytes, str]]:
        app = create_rollout_server(
            backend=LocalBackend(workflow=Answer, grader=Exact, artifact_root=tmp_path / "a"),
            configure_logging=False,
        )
        if framework:
            app.fastapi_app()
        got = []
        with serving(app) as url, httpx.Client(base_url=url, timeout=30) as client:
            client.post("/rollout", json=body("slow", sleep=5.0))
            for selector in ({"ids": ["slow", "nope"]}, {"prefix": "zz"}, {"all": True}):
                response = client.post("/rollout/cancel", json=selector)
                got.append(
                    (response.status_code, response.content, response.headers["content-type"])
                )
        return got

    hot = answers(framework=False)
    assert hot == answers(framework=True)
    assert [status for status, _, _ in hot] == [200, 200, 200]
    assert json.loads(hot[0][1])["dispositions"]["nope"] == "not_found"


def test_importing_the_server_module_does_not_import_fastapi() -> None:
    code = (
        "import sys, osmosis.rollout.server; "
        "print(sorted(m for m in ('fastapi', 'starlette') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "[]"
    assert "fastapi" not in done.stderr  # not even briefly (-X importtime lists every import)
