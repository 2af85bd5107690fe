"""The node side of the Ray site: one actor per rollout server, on the node it serves from.

`osmosis.eval.sites.ray.site` makes this class a Ray actor (`ray.remote(RolloutReplica)`) and
places it; this module itself never imports Ray at import time, so the engine's default path
never pays for it. In the actor:

    replica = RolloutReplica()
    info = await replica.start_server(spec)   # uv env on this node, then the rollout server
    reply = await replica.admit(request_json) # ("ok", Lease) or ("fault", kind, message, extra)
    reply = await replica.result(lease, deadline_sec, limits)  # the result + its trial files

The actor's working directory is the run's checkout, shipped by Ray (`runtime_env`
`working_dir`). The rollout server is a child process of the actor (`RolloutProcess`: it dies
with it) listening on the node's loopback. The engine talks to it directly when it answers
from the engine's machine (a node on that machine); otherwise every protocol call goes
through the actor (`admit`, `result`, `cancel`, `health`): rollout entrypoints bind
`127.0.0.1`, which the engine on another machine cannot reach. Direct, the engine fetches
finished attempts' trial files with `take_trials`.
Faults cross the Ray boundary as tagged tuples, never as pickled exceptions, so the engine
sorts them exactly as `osmosis.eval.sites.api` says (`raise_fault`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import socket
import tempfile
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osmosis.eval.sites.api import (
    AdmissionRejected,
    AtCapacity,
    Lease,
    MalformedResponse,
    ResultDeadlineExceeded,
    RolloutServerUnavailable,
)
from osmosis.eval.sites.ray.ship import TrialFiles, TrialLimits, collect_trial
from osmosis.user_cache import user_cache_dir

Reply = tuple[Any, ...]
"""`("ok", value)` or `("fault", kind, message, extra)`."""

_MAX_LOG_LINES = 10_000
TRIALS_TOKEN_FILE = ".replica"  # a rollout id never starts with "."
_FAULTS: dict[str, type[Exception]] = {
    "rejected": AdmissionRejected,
    "busy": AtCapacity,
    "malformed": MalformedResponse,
    "unavailable": RolloutServerUnavailable,
    "deadline": ResultDeadlineExceeded,
}


@dataclass(frozen=True)
class ReplicaSpec:
    """What one replica runs: the rollout (relative to the shipped checkout) and its env."""

    name: str
    rollout: str
    """The rollout's directory relative to the checkout root: `rollouts/scripted`."""
    entrypoint: str
    env: dict[str, str]
    """The run's `[env]` table and resolved secrets."""
    clean_env: bool = False
    """Start the rollout from PATH, HOME and the locale only (the platform), not from the
    node's whole environment."""
    env_cache: str | None = None
    """Where this node caches rollout venvs; None: `$XDG_CACHE_HOME/osmosis/envs`."""
    env_scope: str | None = None
    """Whose venv it is (the workspace): part of the venv's key on the node."""
    startup_timeout: float = 60.0


@dataclass(frozen=True)
class ReplicaInfo:
    """Where a replica runs, as the engine records it."""

    node_id: str
    node_ip: str
    hostname: str
    base_url: str
    health: dict[str, Any] = field(default_factory=dict)
    trials_dir: str = ""
    """Where the server leaves each attempt's files on its node (`<trials_dir>/<rollout id>`)."""
    trials_token: str = ""
    """The content of `<trials_dir>/.replica`: an engine that reads it there shares the
    node's disk (the node is its machine) and takes the files itself, without a Ray call."""


def encode_fault(error: BaseException) -> Reply:
    """A protocol fault as it crosses the Ray boundary."""
    kind = next((k for k, cls in _FAULTS.items() if isinstance(error, cls)), "unavailable")
    if isinstance(error, AdmissionRejected):
        return ("fault", kind, str(error), error.status_code)
    if isinstance(error, AtCapacity):
        return ("fault", kind, str(error), error.retry_after_sec)
    return ("fault", kind, str(error) or type(error).__name__, None)


def raise_fault(reply: Reply) -> Any:
    """The value of an `("ok", value)` reply; raises the protocol fault of any other."""
    if reply[0] == "ok":
        return reply[1]
    _, kind, message, extra = reply
    if kind == "rejected":
        error = AdmissionRejected(int(extra), "")
        error.args = (message,)
        raise error
    if kind == "busy":
        raise AtCapacity(float(extra))
    raise _FAULTS.get(kind, RolloutServerUnavailable)(message)


def default_env_cache() -> Path:
    """Where a node keeps rollout venvs between runs."""
    return user_cache_dir() / "envs"


class RolloutReplica:
    """One rollout server on this node and the calls the engine makes to it."""

    def __init__(self) -> None:
        self._process: Any = None  # RolloutProcess, imported with the server stack
        self._client: Any = None  # RolloutClient
        self._trials: Path | None = None
        self._lines: deque[str] = deque(maxlen=_MAX_LOG_LINES)
        self._line_ready = asyncio.Event()
        self._starting = asyncio.Lock()
        self._name = "rollout"

    # -- lifecycle ----------------------------------------------------------------------------
    async def start_server(self, spec: ReplicaSpec) -> Reply:
        """Prepare the rollout's environment on this node (reusing a cached venv), start
        its server and wait until it is healthy: `("ok", ReplicaInfo)`, or
        `("failed", message, hint, code)` for a `HostError` (a uv failure, an entrypoint
        that raises at import), whose words the engine passes on."""
        from osmosis.eval.errors import HostError

        try:
            return ("ok", await self._start(spec))
        except HostError as error:
            await self._stop_server()
            return ("failed", str(error), error.hint, error.code)

    async def _start(self, spec: ReplicaSpec) -> ReplicaInfo:
        from osmosis.eval.results.redact import Redactor
        from osmosis.eval.sites.environment import prepare_environment_async
        from osmosis.eval.sites.rollout_client import RolloutClient
        from osmosis.eval.sites.rollout_process import RolloutProcess
        from osmosis.eval.sites.sandbox.environment import clean_base_env

        async with self._starting:
            await self._stop_server()
            self._name = spec.name
            rollout_dir = Path.cwd() / spec.rollout
            cache = Path(spec.env_cache) if spec.env_cache else default_env_cache()
            environment = await prepare_environment_async(
                rollout_dir, cache_root=cache, log=self._log, scope=spec.env_scope
            )
            self._trials = Path(tempfile.mkdtemp(prefix=f"osmosis-{spec.name[:40]}-"))
            token = secrets.token_hex(16)
            (self._trials / TRIALS_TOKEN_FILE).write_text(token)
            base_env = (
                clean_base_env(os.environ, home=os.environ.get("HOME", "/"), user=_user())
                if spec.clean_env
                else None
            )
            self._process = await RolloutProcess.start(
                environment,
                rollout_dir,
                spec.entrypoint,
                env=spec.env,
                artifact_root=self._trials,
                log=self._log,
                redactor=Redactor(),  # the engine redacts what it writes; secrets stay there
                startup_timeout=spec.startup_timeout,
                name=spec.name,
                base_env=base_env,
            )
            self._client = RolloutClient(self._process.base_url)
            health = await self._client.health()
            return ReplicaInfo(
                node_id=_node_id(),
                node_ip=_node_ip(),
                hostname=socket.gethostname(),
                base_url=self._process.base_url,
                health=dict(health),
                trials_dir=str(self._trials),
                trials_token=token,
            )

    async def stop(self) -> None:
        async with self._starting:
            await self._stop_server()

    async def watch(self) -> str:
        """Returns when the rollout server exits: why, in its exit reason's words."""
        process = self._process
        if process is None:
            return f"rollout server {self._name!r} is not running"
        await process.exited.wait()
        return str(process.exit_reason)

    async def log_lines(self, wait_sec: float = 1.0) -> list[str]:
        """The output lines since the last call; waits up to `wait_sec` for one."""
        if not self._lines:
            self._line_ready.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._line_ready.wait(), wait_sec)
        lines = list(self._lines)
        self._lines.clear()
        return lines

    # -- the protocol, relayed ------------------------------------------------------------------
    async def health(self) -> Reply:
        try:
            return ("ok", await self._require().health())
        except Exception as error:
            return encode_fault(error)

    async def admit(self, request_json: bytes) -> Reply:
        from osmosis.rollout.protocol import RolloutInitRequest

        try:
            request = RolloutInitRequest.model_validate_json(request_json)
            return ("ok", await self._require().start(request))
        except Exception as error:
            return encode_fault(error)

    async def result(self, lease: Lease, deadline_sec: float | None, limits: TrialLimits) -> Reply:
        """The terminal result (as JSON bytes) and, with it, the attempt's trial files; the
        node's copy of them is removed."""
        try:
            result = await self._require().wait(lease, deadline_sec=deadline_sec)
        except Exception as error:
            return encode_fault(error)
        trial = await asyncio.to_thread(self._take_trial, lease.rollout_id, limits)
        return ("ok", (result.model_dump_json().encode(), trial))

    async def take_trials(
        self, rollout_ids: list[str], limits: TrialLimits
    ) -> dict[str, TrialFiles]:
        """The trial files of several finished attempts at once (the engine talking to the
        server directly fetches them this way): only those that left files, by id."""
        return await asyncio.to_thread(self._take_trials, rollout_ids, limits)

    async def cancel(self, rollout_ids: list[str]) -> Reply:
        try:
            return ("ok", await self._require().cancel(rollout_ids))
        except Exception as error:
            return encode_fault(error)

    # -- inside ---------------------------------------------------------------------------------
    def _require(self) -> Any:
        if self._client is None or self._process is None or not self._process.alive:
            raise RolloutServerUnavailable(f"rollout server {self._name!r} is not running")
        return self._client

    def _take_trials(self, rollout_ids: list[str], limits: TrialLimits) -> dict[str, TrialFiles]:
        taken = {}
        for rollout_id in rollout_ids:
            if self._trial_dir(rollout_id) is not None:  # most attempts leave none: a stat
                trial = self._take_trial(rollout_id, limits)
                if trial.files or trial.skipped:
                    taken[rollout_id] = trial
        return taken

    def _trial_dir(self, rollout_id: str) -> Path | None:
        if self._trials is None or not rollout_id or "/" in rollout_id or rollout_id[0] == ".":
            return None
        directory = self._trials / rollout_id
        return directory if directory.is_dir() else None

    def _take_trial(self, rollout_id: str, limits: TrialLimits) -> TrialFiles:
        if self._trials is None or not rollout_id or "/" in rollout_id or rollout_id[0] == ".":
            return TrialFiles()
        directory = self._trials / rollout_id
        try:
            return collect_trial(directory, limits)
        finally:
            shutil.rmtree(directory, ignore_errors=True)  # rmtree never follows links

    def _log(self, line: str) -> None:
        self._lines.append(line)
        self._line_ready.set()

    async def _stop_server(self) -> None:
        client, self._client = self._client, None
        process, self._process = self._process, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.aclose()
        if process is not None:
            await process.stop()
        trials, self._trials = self._trials, None
        if trials is not None:
            await asyncio.to_thread(shutil.rmtree, trials, True)


def _node_id() -> str:
    import ray

    return str(ray.get_runtime_context().get_node_id())


def _node_ip() -> str:
    import ray

    return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]


def _user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "rollout"


__all__ = [
    "TRIALS_TOKEN_FILE",
    "ReplicaInfo",
    "ReplicaSpec",
    "Reply",
    "RolloutReplica",
    "default_env_cache",
    "encode_fault",
    "raise_fault",
]
