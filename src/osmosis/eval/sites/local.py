"""The local-process site: rollout servers as child processes of the engine, on this machine.

    site = LocalProcessSite(environment, rollout_dir, "main.py", env=variables,
                            trials_root=run_dir / "rollout_trials", log=log, redactor=redactor)
    async with site:
        await site.start(replicas=2)      # scripted-0, scripted-1: healthy, capacity known
        ...                               # Engine(site=site, ...)

A host asks for it with `LocalSiteSpec` (`osmosis.eval.sites.spec.start_site`).

Every replica is a `RolloutProcess` (own port, own process group, dies with the engine) and
a `RolloutClient`. They share one trials root: rollout ids are unique, so each attempt's
`trajectory.json` and `artifacts/` already sit at `trials_root/<rollout_id>`, and
`Endpoint.trial` has nothing to fetch. A replica that dies or stops answering is stopped and
started again under the same name, up to `max_restarts` times per replica within any
`restart_window_sec` (ten minutes by default, `seam.RestartBudget`).

A run of one replica first asks `prestart` for the server `osmosis eval run` started at its
entry: adopted when its launch (command, directory, environment but for the port and the
instance id) is the one this site would make now, killed and reaped otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

from osmosis.eval.results.redact import Redactor
from osmosis.eval.sites import prestart
from osmosis.eval.sites.api import ResourceLimitBreach, RolloutAPI
from osmosis.eval.sites.environment import RolloutEnvironment
from osmosis.eval.sites.prestart import Prestarted
from osmosis.eval.sites.rollout_client import RolloutClient
from osmosis.eval.sites.rollout_process import (
    DEFAULT_STARTUP_TIMEOUT_SEC,
    RolloutProcess,
    RolloutStartError,
    lost_its_port,
)
from osmosis.eval.sites.seam import RESTART_WINDOW_SEC, Endpoint, RestartBudget, start_all
from osmosis.eval.sites.spawn import rollout_launch

DEFAULT_MAX_RESTARTS = 2
"""How many times each replica is started again after it died, within the restart window."""

_HOSTNAME = socket.gethostname()


class LocalEndpoint:
    """One rollout server child process and the client that speaks to it."""

    def __init__(
        self,
        name: str,
        process: RolloutProcess,
        client: RolloutClient,
        *,
        capacity: int | None,
        trials_root: Path,
    ) -> None:
        self._name = name
        self.process = process
        self._client = client
        self._capacity = capacity
        self._trials_root = trials_root

    @property
    def name(self) -> str:
        return self._name

    @property
    def node(self) -> str:
        return _HOSTNAME  # read for every attempt it serves: one system call per process

    @property
    def base_url(self) -> str:
        return self.process.base_url

    @property
    def capacity(self) -> int | None:
        return self._capacity

    @property
    def api(self) -> RolloutAPI:
        return self._client

    @property
    def dead(self) -> asyncio.Event:
        return self.process.exited

    @property
    def death_reason(self) -> str:
        return self.process.exit_reason

    @property
    def breach(self) -> ResourceLimitBreach | None:
        return None  # no limits here (the sandbox site's endpoints have them)

    async def trial(self, rollout_id: str) -> Path | None:
        # Most attempts leave none (no artifacts, the trajectory sent with the result).
        if not os.path.isdir(f"{self._trials_root}/{rollout_id}"):  # noqa: ASYNC240 - a stat
            return None
        return self._trials_root / rollout_id

    async def stop(self) -> None:
        try:
            await self._client.aclose()
        finally:
            await self.process.stop()


class LocalProcessSite:
    """Starts N rollout servers on this machine, replaces dead ones, stops them all."""

    def __init__(
        self,
        environment: RolloutEnvironment,
        rollout_dir: Path,
        entrypoint: str | Path,
        *,
        env: Mapping[str, str],
        trials_root: Path,
        log: Callable[[str], None],
        redactor: Redactor,
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        restart_window_sec: float = RESTART_WINDOW_SEC,
        startup_timeout: float = DEFAULT_STARTUP_TIMEOUT_SEC,
        base_env: Mapping[str, str] | None = None,
        on_spawned: Callable[[], None] | None = None,
    ) -> None:
        self.environment = environment
        self.rollout_dir = rollout_dir
        self.entrypoint = entrypoint
        self.env = dict(env)
        self.trials_root = trials_root
        self.log = log
        self.redactor = redactor
        self.restarts = RestartBudget(max_restarts, window_sec=restart_window_sec)
        self.startup_timeout = startup_timeout
        self.base_env = base_env  # None: this process's environment (see child_environment)
        # Called as each server's process runs, before it answers (`SiteContext.on_spawned`).
        self.on_spawned = on_spawned or _nothing
        self._endpoints: list[LocalEndpoint] = []

    @property
    def endpoints(self) -> Sequence[Endpoint]:
        """The replicas running now (a replaced one is gone from the list)."""
        return list(self._endpoints)

    async def start(self, replicas: int | None = 1) -> None:
        """Start `replicas` servers at once (None: one, this machine's) and wait until each
        is healthy. Raises `RolloutStartError` (all of them stopped) if one does not start."""
        if replicas is None:
            replicas = 1
        if replicas < 1:
            raise ValueError(f"replicas must be at least 1, got {replicas}")
        base = self.rollout_dir.name
        names = [base if replicas == 1 else f"{base}-{index}" for index in range(replicas)]
        if replicas > 1:  # the command line starts one server early, never several
            self._not_adopted(prestart.claim(), f"the run starts {replicas} rollout servers")
        try:
            await start_all([self._launch(name) for name in names], self._endpoints)
        except Exception:
            await self.stop()
            raise

    async def replace(self, endpoint: Endpoint, reason: str) -> Endpoint:
        """Stop `endpoint` and start a server under its name, within the restart budget
        (`SiteExhausted` past it)."""
        if endpoint in self._endpoints:
            self._endpoints.remove(endpoint)
        if isinstance(endpoint, LocalEndpoint):
            await endpoint.stop()  # it may still run (it stopped answering): never two
        name = endpoint.name
        free = self._free_restart(endpoint)
        if free is not None:
            self.log(f"restarting rollout server {name} ({free})")
        else:
            number = self.restarts.charge(name)
            self.log(f"restarting rollout server {name} ({self.restarts.describe(number)})")
        new = await self._launch(name)
        self._endpoints.append(new)
        return new

    async def stop(self) -> None:
        """Stop every replica (SIGTERM, a grace period, SIGKILL). Idempotent."""
        endpoints, self._endpoints = self._endpoints, []
        await asyncio.gather(*(e.stop() for e in endpoints), return_exceptions=True)

    async def __aenter__(self) -> LocalProcessSite:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def _free_restart(self, endpoint: Endpoint) -> str | None:
        """Why restarting `endpoint` is not charged to its budget, if it is not (the sandbox
        site: a server killed for one attempt's resource limit); None: it is charged."""
        return None

    async def _launch(self, name: str) -> LocalEndpoint:
        process = await self._adopt(name) or await RolloutProcess.start(
            self.environment,
            self.rollout_dir,
            self.entrypoint,
            env=self.env,
            artifact_root=self.trials_root,
            log=self.log,
            redactor=self.redactor,
            startup_timeout=self.startup_timeout,
            name=name,
            base_env=self.base_env,
            spawned=self.on_spawned,
        )
        client = RolloutClient(process.base_url)
        try:
            capacity = capacity_of(await client.health())
        except BaseException:
            with contextlib.suppress(Exception):
                await client.aclose()
            await process.stop()
            raise
        return LocalEndpoint(name, process, client, capacity=capacity, trials_root=self.trials_root)

    async def _adopt(self, name: str) -> RolloutProcess | None:
        """The server the command line started at its entry (`prestart`), when its launch is
        the one this site would make now; None (it is killed) otherwise, or when there is none."""
        early = prestart.claim()
        if early is None:
            return None
        expected = rollout_launch(
            self.environment,
            self.rollout_dir,
            self.entrypoint,
            env=self.env,
            base_env=os.environ if self.base_env is None else self.base_env,
            artifact_root=self.trials_root,
            port=early.port,
            instance_id=early.instance_id,
        )
        differs = early.difference(expected)
        if differs is not None:
            self._not_adopted(early, f"its {differs} differs from this run's")
            return None
        self.trials_root.resolve().mkdir(parents=True, exist_ok=True)
        self.log(
            f"rollout server {name}: started at the command's entry, "
            f"{time.monotonic() - early.began:.2f} s ago (the same launch): adopted"
        )
        self.on_spawned()
        try:
            return await RolloutProcess.adopt(
                early.popen,
                name=name,
                port=early.port,
                instance_id=early.instance_id,
                ready_fd=early.ready_fd,
                log=self.log,
                redactor=self.redactor,
                startup_timeout=self.startup_timeout,
            )
        except RolloutStartError as error:
            if not lost_its_port(error, early.port):
                raise
            # Another process took its port before it listened: a fresh start picks another.
            self.log(
                f"rollout server {name}: port {early.port} was taken before it could listen; "
                "starting it again on another port"
            )
            return None

    def _not_adopted(self, early: Prestarted | None, why: str) -> None:
        if early is not None:
            early.kill()
            self.log(f"rollout server started at the command's entry stopped: {why}")


def capacity_of(health: Mapping[str, object]) -> int | None:
    """How many rollouts a server runs at once, from its `/health` document (our SDK and
    osmosis-ai both say `concurrency.max_concurrent`); None when it does not say."""
    concurrency = health.get("concurrency")
    if isinstance(concurrency, dict):
        value = concurrency.get("max_concurrent")
        if isinstance(value, int) and value > 0:
            return value
    value = health.get("max_queue_depth")
    return value if isinstance(value, int) and value > 0 else None


def _nothing() -> None:
    pass


__all__ = ["DEFAULT_MAX_RESTARTS", "LocalEndpoint", "LocalProcessSite", "capacity_of"]
