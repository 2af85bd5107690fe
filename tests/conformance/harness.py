"""Start a conformance entrypoint as a real server process and talk rollout protocol 0.4 to it.

    server = RolloutServer.start(OSMOSIS_AI, ServerSettings(max_concurrent=1), workdir=tmp)
    handle = server.submit(meta(behaviour="sleep:0.5"), label="4")
    assert server.wait_terminal(handle)["status"] == "success"

Everything goes over loopback HTTP with plain httpx, so the same checks hold for any server that
speaks the protocol, whichever SDK built it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from tests.ports import free_port

from .apps.behaviours import ServerSettings

REPO_ROOT = Path(__file__).resolve().parents[2]
APPS_DIR = Path(__file__).resolve().parent / "apps"
INTEROP_VENV = REPO_ROOT / ".venv-interop"

LEASE_HEADER = "X-Osmosis-Rollout-Lease"
TERMINAL = frozenset({"success", "failure", "cancelled"})
IN_FLIGHT = frozenset({"queued", "running", "grading"})
RESULT_KEYS = frozenset({"rollout_id", "status", "sample", "err_message", "err_category"})
SAMPLE_KEYS = frozenset({"messages", "label", "reward", "remove_sample", "metrics", "extra_fields"})

DEFAULT_PROMPT: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a calculator."},
    {"role": "user", "content": "What is 2 + 2?"},
]
LLM_API_KEY = "conformance-llm-key"
STARTUP_TIMEOUT_SEC = 30.0
STOP_TIMEOUT_SEC = 5.0

# Environment variables a parent shell might carry that would leak into RolloutContext or move
# where the server writes; the harness controls all of them.
_SCRUBBED_ENV = (
    "OSMOSIS_API_KEY",
    "OSMOSIS_CHAT_COMPLETIONS_URL",
    "OSMOSIS_ROLLOUT_ID",
    "_OSMOSIS_ROLLOUT_ARTIFACT_ROOT",
    "_OSMOSIS_ROLLOUT_INSTANCE_ID",
    "_OSMOSIS_ROLLOUT_PREVIEW_ROOT",
)


@dataclass(frozen=True)
class Flavour:
    """One SDK's entrypoint and the interpreter that runs it."""

    name: str
    python: Path
    app: Path


OSMOSIS = Flavour("osmosis", Path(sys.executable), APPS_DIR / "app_osmosis.py")
OSMOSIS_AI = Flavour("osmosis-ai", INTEROP_VENV / "bin" / "python", APPS_DIR / "app_osmosis_ai.py")


def interop_unavailable_reason() -> str | None:
    """Why the osmosis-ai flavour cannot run here, or None when it can.

    A look at the venv's files, not an import: that would cost a second or two of CPU.
    """
    fix = "create it with: scripts/make-interop-venv.sh"
    if not OSMOSIS_AI.python.exists():
        return f"osmosis-ai flavour needs {OSMOSIS_AI.python} (Python 3.12 + osmosis-ai); {fix}"
    installed = list(INTEROP_VENV.glob("lib/python3.*/site-packages/osmosis_ai/rollout/server"))
    if not installed:
        return f"{INTEROP_VENV} has no osmosis_ai rollout server (osmosis-ai[server]); {fix}"
    return None


def new_id() -> str:
    """A fresh rollout id, 32 hex digits like the controllers mint."""
    return uuid.uuid4().hex


def meta(
    behaviour: str = "echo", grade: str = "exact", answer: str = "4", **extra: Any
) -> dict[str, Any]:
    """Request metadata scripting the workflow (`behaviour`, its reply `answer`) and the grader
    (`grade`). With the default label "4", the default answer earns reward 1.0."""
    return {"behaviour": behaviour, "grade": grade, "answer": answer, **extra}


def rollout_body(
    rollout_id: str,
    metadata: dict[str, Any] | None,
    *,
    label: str | None = "4",
    prompt: list[dict[str, Any]] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A valid `RolloutInitRequest`; `fields` add or override top-level keys."""
    body: dict[str, Any] = {
        "rollout_id": rollout_id,
        "initial_messages": DEFAULT_PROMPT if prompt is None else prompt,
        "label": label,
        "metadata": metadata,
        "chat_completions_url": f"http://127.0.0.1:9/v1/rollouts/{rollout_id}",
        "llm_api_key": LLM_API_KEY,
    }
    body.update(fields)
    return body


@dataclass(frozen=True)
class Submitted:
    """A rollout the server admitted (202)."""

    rollout_id: str
    lease: str
    admission: dict[str, Any]


@dataclass
class RolloutServer:
    """A running entrypoint process plus an HTTP client bound to it."""

    flavour: Flavour
    settings: ServerSettings
    base_url: str
    artifact_root: Path
    instance_id: str | None
    process: subprocess.Popen[bytes]
    log_path: Path
    http: httpx.Client = field(repr=False)
    ready: bool = False

    @classmethod
    def start(
        cls,
        flavour: Flavour,
        settings: ServerSettings,
        *,
        workdir: Path,
        instance_id: str | None = None,
    ) -> RolloutServer:
        """Launch `python app.py` on a free loopback port and wait until /health answers."""
        server = cls.launch(flavour, settings, workdir=workdir, instance_id=instance_id)
        try:
            server.wait_ready()
        except BaseException:
            server.stop()
            raise
        return server

    @classmethod
    def launch(
        cls,
        flavour: Flavour,
        settings: ServerSettings,
        *,
        workdir: Path,
        instance_id: str | None = None,
    ) -> RolloutServer:
        """Start the process without waiting for it; call `wait_ready()` (or `stop()`) next.
        Launch several, then wait for each: they import in parallel."""
        settings = replace(settings, port=free_port())
        artifact_root = workdir / "artifacts"
        artifact_root.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
        env.update(settings.to_env())
        env["_OSMOSIS_ROLLOUT_ARTIFACT_ROOT"] = str(artifact_root)
        env["PYTHONUNBUFFERED"] = "1"
        if instance_id is not None:
            env["_OSMOSIS_ROLLOUT_INSTANCE_ID"] = instance_id
        log_path = workdir / "server.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [str(flavour.python), str(flavour.app)],
                cwd=APPS_DIR,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        base_url = f"http://127.0.0.1:{settings.port}"
        timeout = httpx.Timeout(settings.result_wait_timeout_sec + 15.0)
        return cls(
            flavour=flavour,
            settings=settings,
            base_url=base_url,
            artifact_root=artifact_root,
            instance_id=instance_id,
            process=process,
            log_path=log_path,
            http=httpx.Client(base_url=base_url, timeout=timeout),
        )

    def wait_ready(self) -> None:
        """Return once GET /health answers 200; raise with the server's log if it never does."""
        if self.ready:
            return
        deadline = time.monotonic() + STARTUP_TIMEOUT_SEC
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.flavour.name} server exited with {self.process.returncode} before "
                    f"answering /health:\n{self.log_tail()}"
                )
            try:
                if self.http.get("/health", headers=self.auth()).status_code == 200:
                    self.ready = True
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(
            f"{self.flavour.name} server did not answer /health within "
            f"{STARTUP_TIMEOUT_SEC}s:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Cancel what is in flight, SIGTERM, and SIGKILL if it lingers; close the client."""
        self.request_stop()
        self.await_stop()

    def request_stop(self) -> None:
        """The first half of `stop()`: cancel everything and SIGTERM, without waiting."""
        if self.process.poll() is None:
            # Cancel first: a graceful shutdown otherwise drains in-flight rollouts.
            with contextlib.suppress(httpx.HTTPError):
                self.http.post("/rollout/cancel", json={"all": True}, headers=self.auth())
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)

    def await_stop(self) -> None:
        """The second half of `stop()`: wait for the exit (SIGKILL after a grace period)."""
        try:
            try:
                self.process.wait(STOP_TIMEOUT_SEC)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(STOP_TIMEOUT_SEC)
        finally:
            self.http.close()

    # -- requests ---------------------------------------------------------------------------

    def auth(self) -> dict[str, str]:
        """The Authorization header this server expects (empty without an api_key)."""
        if self.settings.api_key is None:
            return {}
        return {"Authorization": f"Bearer {self.settings.api_key}"}

    def health(self) -> dict[str, Any]:
        response = self.http.get("/health", headers=self.auth())
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    def fresh_client(self) -> httpx.Client:
        """A client with its own connections, for requests that may cost the connection."""
        return httpx.Client(base_url=self.base_url, timeout=self.http.timeout)

    def post_rollout(
        self, body: Mapping[str, Any] | bytes, *, client: httpx.Client | None = None
    ) -> httpx.Response:
        """POST /rollout with a JSON object, or with raw bytes sent as application/json."""
        headers = {**self.auth(), "Content-Type": "application/json"}
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return (client or self.http).post("/rollout", content=content, headers=headers)

    def submit(
        self, metadata: dict[str, Any] | None, *, rollout_id: str | None = None, **fields: Any
    ) -> Submitted:
        """POST a valid rollout and require 202."""
        rollout_id = rollout_id or new_id()
        response = self.post_rollout(rollout_body(rollout_id, metadata, **fields))
        assert response.status_code == 202, f"{response.status_code}: {response.text}"
        admission: dict[str, Any] = response.json()
        return Submitted(rollout_id, admission["polling_lease_token"], admission)

    def result(
        self, rollout_id: str, lease: str | None, *, client: httpx.Client | None = None
    ) -> httpx.Response:
        """One long-poll of GET /rollout/{id}/result; `lease=None` omits the header."""
        headers = self.auth()
        if lease is not None:
            headers[LEASE_HEADER] = lease
        return (client or self.http).get(f"/rollout/{rollout_id}/result", headers=headers)

    def cancel(self, selector: Mapping[str, Any]) -> httpx.Response:
        return self.http.post("/rollout/cancel", json=dict(selector), headers=self.auth())

    def cancel_ok(self, selector: Mapping[str, Any]) -> dict[str, str]:
        response = self.cancel(selector)
        assert response.status_code == 200, response.text
        dispositions: dict[str, str] = response.json()["dispositions"]
        return dispositions

    # -- waiting ----------------------------------------------------------------------------

    def wait_terminal(
        self,
        handle: Submitted,
        *,
        timeout: float = 20.0,
        seen: list[str] | None = None,
        client: httpx.Client | None = None,
    ) -> dict[str, Any]:
        """Long-poll until the rollout is terminal; check the result invariants; return it.

        Every status the server reported is appended to `seen`.
        """
        deadline = time.monotonic() + timeout
        statuses: list[str] = [] if seen is None else seen
        while True:
            response = self.result(handle.rollout_id, handle.lease, client=client)
            assert response.status_code == 200, f"{response.status_code}: {response.text}"
            body: dict[str, Any] = response.json()
            statuses.append(body["status"])
            if body["status"] in TERMINAL:
                check_result_invariants(body, handle.rollout_id)
                return body
            assert body["status"] in IN_FLIGHT, body
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{handle.rollout_id} still {body['status']} after {timeout}s "
                    f"(statuses seen: {statuses})"
                )

    def wait_terminal_all(
        self, handles: Iterable[Submitted], *, timeout: float = 20.0
    ) -> list[dict[str, Any]]:
        """Poll several rollouts at once (one thread and connection each) so every lease stays
        renewed; results come back in the order of `handles`."""
        handles = list(handles)

        def wait(handle: Submitted) -> dict[str, Any]:
            with self.fresh_client() as client:
                return self.wait_terminal(handle, timeout=timeout, client=client)

        with ThreadPoolExecutor(max_workers=max(1, len(handles))) as pool:
            return list(pool.map(wait, handles))

    def wait_health(
        self, predicate: Callable[[dict[str, Any]], bool], *, timeout: float = 10.0
    ) -> dict[str, Any]:
        """Poll GET /health (which renews no lease) until `predicate` holds."""
        deadline = time.monotonic() + timeout
        while True:
            health = self.health()
            if predicate(health):
                return health
            if time.monotonic() > deadline:
                raise AssertionError(f"/health never matched within {timeout}s; last: {health}")
            time.sleep(0.05)

    def wait_idle(self, *, timeout: float = 10.0) -> None:
        self.wait_health(is_idle, timeout=timeout)

    def reset(self) -> None:
        """Cancel everything in flight and wait until the server is idle."""
        self.cancel_ok({"all": True})
        self.wait_idle()

    def rollout_dir(self, rollout_id: str) -> Path:
        return self.artifact_root / rollout_id


def pending(health: Mapping[str, Any]) -> int:
    """Queued plus running rollouts, as the backend's concurrency block reports them."""
    concurrency = health["concurrency"]
    return int(concurrency["queued"]) + int(concurrency["running"])


def is_idle(health: Mapping[str, Any]) -> bool:
    return pending(health) == 0 and health["lifecycle"]["active_rollouts"] == 0


def check_result_invariants(body: Mapping[str, Any], rollout_id: str) -> None:
    """What every terminal result must satisfy, whatever the rollout did."""
    assert set(body) == RESULT_KEYS, body
    assert body["rollout_id"] == rollout_id, body
    sample = body["sample"]
    if sample is not None:
        assert "trajectory_messages" not in sample, sample
        if body["status"] != "success" or sample["remove_sample"]:
            assert sample["reward"] is None, f"reward must be null here: {body}"


def wait_for_path(path: Path, *, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear within {timeout}s")
        time.sleep(0.05)
