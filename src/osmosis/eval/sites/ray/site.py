"""The Ray site: a run's rollout servers as Ray actors spread over an existing cluster.

    site = RaySite(address="10.0.0.5:6379", workspace=checkout, rollout_dir=..., entrypoint=
                   "main.py", env=variables, trials_root=run / "rollout_trials", log=log,
                   redactor=redactor)
    async with site:
        await site.start(replicas=None)   # one per alive node; or an exact number
        ...                               # Engine(site=site, ...), as with the local site

A host asks for it with `RaySiteSpec` (`osmosis.eval.sites.spec.start_site`).

The only module that imports `ray` (`pip install 'osmosis-eval[ray]'`; without it the host says
so). How it works:

- **Connect.** `ray.init(address)` in a thread, with the run's checkout as the job's
  `runtime_env` `working_dir`: a zip we build (`osmosis.eval.sites.ray.ship`: regular files only,
  no `.git`, venvs, caches or `.osmosis/`), which Ray ships once to every node. No address:
  `RAY_ADDRESS`, else a cluster already running on this machine; the site never starts one.
- **Place.** Replica *i* is a `RolloutReplica` actor (`osmosis.eval.sites.ray.actor`) pinned to
  alive node *i mod n* (head first): one per node by default, an even spread for any
  number, capped by `max_replicas` (the platform's fairness cap). Pinned, not SPREAD or
  soft affinity: measured on a two-node cluster, both put two replicas on one node.
  `num_cpus=0`: the rollout server's own capacity is what limits it.
- **Serve.** Each actor builds or reuses the rollout's uv environment on its node
  (`prepare_environment`) and starts the rollout server as its child. The engine then talks
  to the server directly over HTTP when it answers from here (`transport="auto"`): at
  `127.0.0.1` when the node is this machine, else at the node's address (rollout
  entrypoints usually bind loopback, so a remote node rarely answers), checked with a
  GET /health whose `instance_id` must be that server's. A server that does not answer is
  reached through its actor (the relay: admit, long-poll, cancel and health are actor
  calls, one more hop per attempt: bench/ray.py `transport`). The run's log says which,
  per replica. Each attempt's trial files (bounded by the run's artifact limits) reach
  `trials_root/<rollout_id>` with the relayed result; direct, `trial()` takes them from
  the node's directory itself when that is this machine's (the actor's token file reads
  the same here: no Ray call per attempt), else fetches them in one actor call for every
  attempt finished meanwhile. No disk is assumed shared between machines.
  `transport="actor"` / `"http"` force one path (bench/ray.py compares them);
  `server_host` (`OSMOSIS_RAY_SERVER_HOST`) names the host to try instead of the node's.
- **Fail.** An endpoint is dead when its server exits (the actor says why) or its actor
  dies (its node is gone, its worker crashed: Ray says so). The engine drains it (attempts
  back to pending with fresh rollout ids) and calls `replace`: a replica whose actor lives
  restarts its server in place; one whose actor is gone gets a new actor on the alive node
  with the fewest replicas, never the one it was lost on while another is left. Each name
  restarts `max_restarts` times within any restart window (`seam.RestartBudget`); Ray's
  own actor restarts stay off (`max_restarts=0`) so this budget is the only one and a
  restarted actor never comes back empty behind the engine's back.
- **Stop.** Actors are killed, the driver disconnects (`ray.shutdown`): they die with the
  run even when the engine's process is killed, since Ray ends a job's actors with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any, Literal
from urllib.parse import urlsplit

from osmosis.eval.errors import HostError
from osmosis.eval.results.redact import Redactor
from osmosis.eval.results.trial_outputs import DEFAULT_ARTIFACT_LIMITS, ArtifactLimits
from osmosis.eval.sites.api import (
    Lease,
    ResourceLimitBreach,
    RolloutAPI,
    RolloutServerUnavailable,
    parse_result,
)
from osmosis.eval.sites.local import DEFAULT_MAX_RESTARTS, capacity_of
from osmosis.eval.sites.ray.actor import (
    TRIALS_TOKEN_FILE,
    ReplicaInfo,
    ReplicaSpec,
    RolloutReplica,
    raise_fault,
)
from osmosis.eval.sites.ray.ship import (
    TrialFiles,
    TrialLimits,
    collect_trial,
    pack_working_dir,
    write_trial,
)
from osmosis.eval.sites.rollout_client import RolloutClient
from osmosis.eval.sites.seam import (
    RESTART_WINDOW_SEC,
    Endpoint,
    RestartBudget,
    SiteExhausted,
    start_all,
)
from osmosis.rollout.protocol import RolloutInitRequest, RolloutResultResponse

RAY_EXTRA_HINT = "install the Ray extra: pip install 'osmosis-eval[ray]'"
_CONNECT_TIMEOUT_SEC = 120.0
_CALL_GRACE_SEC = 30.0  # beyond a result's own deadline, how long a relayed poll may take
_LOG_POLL_SEC = 1.0
_STOP_WAIT_SEC = 10.0
_PROBE_SEC = 3.0  # how long the direct address has to answer its GET /health
SERVER_HOST_ENV = "OSMOSIS_RAY_SERVER_HOST"

Transport = Literal["auto", "actor", "http"]
"""How the engine reaches a replica's server: directly when it answers, else relayed
("auto"); always through the actor; always directly (this machine's nodes only)."""


class RayUnavailable(HostError):
    """No Ray here: the extra is not installed, or no cluster answers at the address."""


class RayStartError(HostError):
    """A replica did not start on its node (the rollout's environment or entrypoint)."""

    default_hint = "fix the rollout's entrypoint or pyproject.toml; nothing was dispatched"


def import_ray() -> ModuleType:
    """`ray`, or `RayUnavailable` naming the extra that provides it."""
    try:
        import ray
    except ImportError:
        raise RayUnavailable(
            "the Ray executor needs the ray package, which is not installed: "
            "pip install 'osmosis-eval[ray]'",
            hint=RAY_EXTRA_HINT,
        ) from None
    return ray


def bridge_reach_problem(
    bridge_url: str, node_ips: Sequence[str], *, local_ip: str | None = None
) -> str | None:
    """Why rollouts on these nodes cannot reach a bridge at `bridge_url`, if they cannot: a
    loopback bridge is reachable from this machine's nodes only (`local_ip`: this
    machine's node address, as Ray knows it).

    bridge_reach_problem("http://127.0.0.1:9000", ["10.0.0.7"])  # 'the model bridge ...'
    """
    from osmosis.loopback import is_loopback

    host = urlsplit(bridge_url).hostname or ""
    remote = sorted({ip for ip in node_ips if not is_loopback(ip) and ip != local_ip})
    if is_loopback(host) and remote:
        return (
            f"the model bridge listens on {host}, which the rollouts on Ray nodes "
            f"{', '.join(remote)} cannot reach"
        )
    return None


@dataclass
class _Placement:
    node_id: str
    node_ip: str


class RayEndpoint:
    """One replica: its actor, where it runs, and the API that reaches its server."""

    def __init__(
        self,
        name: str,
        actor: Any,
        info: ReplicaInfo,
        *,
        site: RaySite,
        direct_url: str | None = None,
        trials_here: Path | None = None,
    ) -> None:
        self._name = name
        self.actor = actor
        self.info = info
        self._site = site
        self._capacity = capacity_of(info.health)
        self._dead = asyncio.Event()
        self._reason = ""
        self.actor_alive = True
        """False once Ray says the actor itself is gone (not only its server)."""
        self.direct_url = direct_url
        """Where the engine talks to the server itself; None: through the actor."""
        self._api: RolloutAPI
        self.trials_here = trials_here
        """The node's trial directory, when the engine shares the node's disk."""
        self._trials: _TrialBatcher | None = None
        if direct_url is not None:
            self._api = RolloutClient(direct_url)
            if trials_here is None:
                self._trials = _TrialBatcher(self)
        else:
            self._api = _ActorAPI(self)
        self._tasks = [
            asyncio.create_task(self._watch(), name=f"ray-watch-{name}"),
            asyncio.create_task(self._forward_logs(), name=f"ray-logs-{name}"),
        ]

    @property
    def name(self) -> str:
        return self._name

    @property
    def node(self) -> str:
        return f"{self.info.node_ip} (ray node {self.info.node_id[:12]})"

    @property
    def base_url(self) -> str:
        return f"ray://{self.info.node_ip}/{self._name} ({self.info.base_url} on its node)"

    @property
    def capacity(self) -> int | None:
        return self._capacity

    @property
    def api(self) -> RolloutAPI:
        return self._api

    @property
    def dead(self) -> asyncio.Event:
        return self._dead

    @property
    def death_reason(self) -> str:
        return self._reason

    @property
    def breach(self) -> ResourceLimitBreach | None:
        return None  # the cluster's nodes enforce no limits of ours

    async def trial(self, rollout_id: str) -> Path | None:
        path = self._site.trials_root / rollout_id
        if self.trials_here is not None:  # the node is this machine: no Ray call
            source = self.trials_here / rollout_id
            # Most attempts leave none: a stat, as on the local site.
            if _plain_id(rollout_id) and os.path.isdir(source):  # noqa: ASYNC240
                await asyncio.to_thread(self._site.take_trial_here, rollout_id, source)
        elif self._trials is not None:  # direct; relayed, the files came with the result
            await self._trials.fetch(rollout_id)
        return path if path.is_dir() else None

    def mark_dead(self, reason: str) -> None:
        if not self._dead.is_set():
            self._reason = reason
            self._dead.set()

    async def stop(self, *, kill: bool = True) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._trials is not None:
            await self._trials.close()
        with contextlib.suppress(Exception):
            await self._api.aclose()
        if kill:
            ray = self._site.ray
            if self.actor_alive:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.actor.stop.remote(), _STOP_WAIT_SEC)
            with contextlib.suppress(Exception):
                ray.kill(self.actor, no_restart=True)
        self.mark_dead(f"rollout server {self._name!r} was stopped")

    async def _watch(self) -> None:
        ray = self._site.ray
        try:
            reason = await self.actor.watch.remote()
        except ray.exceptions.RayError as error:
            self.actor_alive = False
            reason = f"the Ray actor of rollout server {self._name!r} is gone: {_first_line(error)}"
        self.mark_dead(reason)

    async def _forward_logs(self) -> None:
        ray = self._site.ray
        prefix = f"[{self._name} @ {self.info.node_ip}] "
        while True:
            try:
                lines = await self.actor.log_lines.remote(_LOG_POLL_SEC)
            except ray.exceptions.RayError:
                return
            for line in lines:
                self._site.emit(prefix + line)


class _TrialBatcher:
    """Direct transport: the trial files of attempts finished on one replica, fetched from
    its actor in one call for all those asked for meanwhile (at 16 in flight, one actor
    call per several attempts instead of one each)."""

    def __init__(self, endpoint: RayEndpoint) -> None:
        self._endpoint = endpoint
        self._waiting: dict[str, asyncio.Future[None]] = {}
        self._runner: asyncio.Task[None] | None = None
        self._closed = False

    async def close(self) -> None:
        """Stop fetching; whoever still waits goes on without trial files."""
        self._closed = True
        if self._runner is not None:
            self._runner.cancel()
            await asyncio.gather(self._runner, return_exceptions=True)
        waiting, self._waiting = self._waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_result(None)

    async def fetch(self, rollout_id: str) -> None:
        """Until `rollout_id`'s trial files (if any) are in `trials_root/<rollout_id>`;
        nothing when the actor is gone (the attempt then has no trial directory)."""
        if self._closed:
            return
        waiting = self._waiting.get(rollout_id)
        if waiting is None:
            waiting = self._waiting[rollout_id] = asyncio.get_running_loop().create_future()
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(
                self._run(), name=f"ray-trials-{self._endpoint.name}"
            )
        await asyncio.shield(waiting)

    async def _run(self) -> None:
        site = self._endpoint._site
        ray = site.ray
        while self._waiting:
            batch, self._waiting = self._waiting, {}
            failure: BaseException | None = None
            try:
                trials = await self._endpoint.actor.take_trials.remote(
                    list(batch), site.trial_limits
                )
                if trials:
                    await asyncio.to_thread(_store_trials, site, trials)
            except ray.exceptions.RayError:
                pass  # the actor is gone: its node's trial files with it
            except Exception as error:  # writing them here: each attempt waiting hears it
                failure = error
            finally:
                for waiting in batch.values():
                    if waiting.done():
                        continue
                    if failure is None:
                        waiting.set_result(None)
                    else:
                        waiting.set_exception(failure)
                        waiting.exception()  # read: an attempt cancelled meanwhile is no leak


class _ActorAPI:
    """The rollout protocol, relayed by the replica's actor (see `RolloutReplica`)."""

    def __init__(self, endpoint: RayEndpoint) -> None:
        self._endpoint = endpoint
        self._site = endpoint._site

    async def _call(self, method: Any, *args: Any, within: float | None = None) -> Any:
        ray = self._site.ray
        ref = method.remote(*args)
        try:
            return await asyncio.wait_for(ref, within) if within is not None else await ref
        except ray.exceptions.RayError as error:
            raise RolloutServerUnavailable(
                f"Ray actor of {self._endpoint.name} unreachable: {_first_line(error)}"
            ) from None
        except TimeoutError:
            with contextlib.suppress(Exception):
                ray.cancel(ref)
            raise RolloutServerUnavailable(
                f"Ray actor of {self._endpoint.name} did not answer within {within:g} s"
            ) from None
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                ray.cancel(ref)  # the engine gave up on the attempt: so does the actor's poll
            raise

    async def health(self) -> dict[str, object]:
        reply = await self._call(self._endpoint.actor.health)
        document: dict[str, object] = raise_fault(reply)
        return document

    async def start(self, request: RolloutInitRequest) -> Lease:
        body = request.model_dump_json(exclude_none=True).encode()
        lease: Lease = raise_fault(await self._call(self._endpoint.actor.admit, body))
        return lease

    async def wait(
        self, lease: Lease, *, deadline_sec: float | None = None
    ) -> RolloutResultResponse:
        timeout = None if deadline_sec is None else deadline_sec + _CALL_GRACE_SEC
        reply = await self._call(
            self._endpoint.actor.result, lease, deadline_sec, self._site.trial_limits,
            within=timeout,
        )  # fmt: skip
        body, trial = raise_fault(reply)
        result = parse_result(body)
        if trial.files or trial.skipped:
            await asyncio.to_thread(self._site.store_trial, lease.rollout_id, trial)
        return result

    async def cancel(self, rollout_ids: list[str]) -> dict[str, str]:
        dispositions: dict[str, str] = raise_fault(
            await self._call(self._endpoint.actor.cancel, rollout_ids)
        )
        return dispositions

    async def aclose(self) -> None:
        return None


class RaySite:
    """Starts a run's rollout servers on a Ray cluster, replaces lost ones, stops them."""

    def __init__(
        self,
        *,
        address: str | None,
        workspace: Path,
        rollout_dir: Path,
        entrypoint: str | Path,
        env: Mapping[str, str],
        trials_root: Path,
        log: Callable[[str], None],
        redactor: Redactor,
        artifact_limits: ArtifactLimits = DEFAULT_ARTIFACT_LIMITS,
        bridge_url: str | None = None,
        clean_env: bool = False,
        max_replicas: int | None = None,
        env_scope: str | None = None,
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        restart_window_sec: float = RESTART_WINDOW_SEC,
        startup_timeout: float = 60.0,
        transport: Transport = "auto",
        server_host: str | None = None,
    ) -> None:
        self.address = address
        self.workspace = workspace.resolve()
        self.rollout = rollout_dir.resolve().relative_to(self.workspace).as_posix()
        self.entrypoint = str(entrypoint)
        self.env = dict(env)
        self.trials_root = trials_root
        self.log = log
        self.redactor = redactor
        self.trial_limits = TrialLimits.for_artifacts(artifact_limits)
        self.bridge_url = bridge_url
        self.clean_env = clean_env
        self.env_scope = env_scope
        self.max_replicas = max_replicas
        self.restarts = RestartBudget(max_restarts, window_sec=restart_window_sec)
        self.startup_timeout = startup_timeout
        self.transport: Transport = transport
        self.server_host = server_host or os.environ.get(SERVER_HOST_ENV) or None
        self.ray: Any = None
        self._replica_class: Any = None
        self._scratch: Path | None = None
        self._connected = False
        self._local_ip: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._restore: Callable[[], None] | None = None
        self._endpoints: list[RayEndpoint] = []

    @property
    def endpoints(self) -> Sequence[Endpoint]:
        return list(self._endpoints)

    # -- starting -----------------------------------------------------------------------------
    async def start(self, replicas: int | None = None) -> None:
        """Connect, ship the checkout, and start `replicas` servers (None: one per alive
        node), each healthy before this returns. Raises `RayUnavailable` / `RayStartError`
        (everything started is stopped)."""
        self.ray = import_ray()
        self._loop = asyncio.get_running_loop()
        try:
            await asyncio.to_thread(self._connect)
            nodes = await asyncio.to_thread(self._alive_nodes)
            if not nodes:
                raise RayUnavailable("the Ray cluster has no alive node")
            if self.bridge_url is not None:
                problem = bridge_reach_problem(
                    self.bridge_url, [n.node_ip for n in nodes], local_ip=self._local_ip
                )
                if problem is not None:
                    raise RayUnavailable(
                        problem,
                        hint="bind the bridge where the nodes reach it: --bridge-host 0.0.0.0 "
                        "--bridge-url http://<this machine>:<port> (OSMOSIS_BRIDGE_HOST/_URL)",
                    )
            count = replicas or len(nodes)
            if self.max_replicas is not None and count > self.max_replicas:
                self.log(
                    f"{count} rollout servers wanted; the per-run cap allows "
                    f"{self.max_replicas} (OSMOSIS_RAY_MAX_REPLICAS)"
                )
                count = self.max_replicas
            base = Path(self.rollout).name
            names = [base if count == 1 else f"{base}-{index}" for index in range(count)]
            placements = [nodes[index % len(nodes)] for index in range(count)]
            self.log(
                f"Ray: {len(nodes)} alive nodes; placing {count} rollout servers: "
                + ", ".join(
                    f"{name} on {where.node_ip} ({where.node_id[:12]})"
                    for name, where in zip(names, placements, strict=True)
                )
            )
            launches = [
                self._launch(name, placement)
                for name, placement in zip(names, placements, strict=True)
            ]
            await start_all(launches, self._endpoints)
        except BaseException:
            await self.stop()
            raise

    def _connect(self) -> None:
        ray = self.ray
        if ray.is_initialized():
            raise RayUnavailable(
                "Ray is already initialised in this process; the Ray site connects itself",
                hint="call ray.shutdown() first",
            )
        self._scratch = Path(tempfile.mkdtemp(prefix="osmosis-ray-"))
        packed = pack_working_dir(self.workspace, self._scratch / "working_dir.zip")
        self.log(f"Ray: shipping the checkout as the job's working_dir ({packed.summary()})")
        address = self.address or os.environ.get("RAY_ADDRESS") or "auto"
        self._divert_ray_messages()
        quiet = logging.getLogger("ray")
        level = quiet.level
        quiet.setLevel(logging.ERROR)  # "SIGTERM handler is not set ... not the main thread"
        try:
            ray.init(
                address=address,
                runtime_env={"working_dir": str(packed.path)},
                namespace="osmosis",
                logging_level=logging.ERROR,
                log_to_driver=False,  # the site forwards the rollout's output itself
            )
        except (ConnectionError, RuntimeError, ValueError) as error:
            raise RayUnavailable(
                f"cannot connect to a Ray cluster at {address}: {_first_line(error)}",
                hint="start one (ray start --head) or pass its address with --ray-address "
                "(OSMOSIS_RAY_ADDRESS on the platform)",
            ) from None
        finally:
            quiet.setLevel(level)
        self._connected = True
        self._local_ip = str(ray.util.get_node_ip_address())  # the driver's node: no lookup
        self._replica_class = ray.remote(RolloutReplica)

    def _divert_ray_messages(self) -> None:
        """Ray's driver prints the cluster's error messages ("the node ... has been marked
        dead") to stdout from a thread of its own, whatever `log_to_driver` says, which would
        break `eval run --json`: they go to the run's log instead, while this site is up."""
        import ray._private.worker as ray_worker

        original = getattr(ray_worker, "print_to_stdstream", None)
        if original is None or self._loop is None:
            return
        loop = self._loop

        def to_log(data: Mapping[str, Any], ignore_prefix: bool = False) -> None:
            for line in data.get("lines", []):
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody reads
                    loop.call_soon_threadsafe(self.emit, f"[ray] {line}")

        ray_worker.print_to_stdstream = to_log
        self._restore = lambda: setattr(ray_worker, "print_to_stdstream", original)

    def _alive_nodes(self) -> list[_Placement]:
        nodes = [n for n in self.ray.nodes() if n.get("Alive")]
        # The head first: a one-replica run lands where the driver is.
        nodes.sort(
            key=lambda n: ("node:__internal_head__" not in n.get("Resources", {}), n["NodeID"])
        )
        return [_Placement(node_id=n["NodeID"], node_ip=n["NodeManagerAddress"]) for n in nodes]

    async def _launch(self, name: str, placement: _Placement) -> RayEndpoint:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        actor = self._replica_class.options(
            name=None,
            num_cpus=0,
            max_restarts=0,
            max_task_retries=0,
            max_concurrency=1000,
            scheduling_strategy=NodeAffinitySchedulingStrategy(placement.node_id, soft=False),
        ).remote()
        return await self._serve(name, actor, placement)

    async def _serve(self, name: str, actor: Any, placement: _Placement) -> RayEndpoint:
        """Start the server on `actor` and wrap it as an endpoint (killing it on failure)."""
        spec = ReplicaSpec(
            name=name,
            rollout=self.rollout,
            entrypoint=self.entrypoint,
            env=self.env,
            clean_env=self.clean_env,
            env_scope=self.env_scope,
            startup_timeout=self.startup_timeout,
        )
        ray = self.ray
        try:
            # The first start on a node may build a uv environment: up to uv's own timeout.
            reply = await asyncio.wait_for(actor.start_server.remote(spec), 1800.0 + 60.0)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
            raise
        except (ray.exceptions.RayError, TimeoutError) as error:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
            raise RayStartError(
                f"rollout server {name} did not start on Ray node {placement.node_ip} "
                f"({placement.node_id[:12]}): {_first_line(error) or 'timed out'}"
            ) from None
        if reply[0] != "ok":
            _, message, hint, code = reply
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
            raise RayStartError(
                f"on Ray node {placement.node_ip}: {self.redactor.redact(message)}",
                hint=hint or None,
                code=code,
            )
        info: ReplicaInfo = reply[1]
        try:
            direct_url = await self._direct_url(name, info)
            trials_here = None
            if direct_url is not None and self._on_this_machine(info):
                trials_here = await asyncio.to_thread(_shared_trials_dir, info)
        except BaseException:  # cancelled while probing: the server is not left behind
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
            raise
        if trials_here is not None:
            self.log(f"Ray: rollout server {name}: trial files taken from {trials_here}")
        return RayEndpoint(
            name, actor, info, site=self, direct_url=direct_url, trials_here=trials_here
        )

    def _on_this_machine(self, info: ReplicaInfo) -> bool:
        from osmosis.loopback import is_loopback

        return info.node_ip == self._local_ip or is_loopback(info.node_ip)

    async def _direct_url(self, name: str, info: ReplicaInfo) -> str | None:
        """Where the engine reaches `info`'s server itself, or None for the relay; the run's
        log says which and why."""
        where = f"rollout server {name} on {info.node_ip}"
        if self.transport == "actor":
            self.log(f"Ray: {where}: protocol calls relayed by its actor (transport=actor)")
            return None
        url = direct_candidate(info, local_ip=self._local_ip, host=self.server_host)
        if self.transport == "http":
            self.log(f"Ray: {where}: protocol calls straight to {url} (transport=http)")
            return url
        problem = await _probe(url, info)
        if problem is None:
            self.log(f"Ray: {where}: protocol calls straight to {url} (it answers from here)")
            return url
        self.log(
            f"Ray: {where}: protocol calls relayed by its actor ({url} does not answer from "
            f"here: {problem})"
        )
        return None

    # -- replacing and stopping -----------------------------------------------------------------
    async def replace(self, endpoint: Endpoint, reason: str) -> Endpoint:
        """Restart `endpoint`'s server: in place while its actor lives, else on another alive
        node (a new actor). Within `max_restarts` per name and restart window; raises
        `SiteExhausted`."""
        if endpoint in self._endpoints:
            self._endpoints.remove(endpoint)
        name = endpoint.name
        try:
            number = self.restarts.charge(name)
        except SiteExhausted:
            if isinstance(endpoint, RayEndpoint):
                await endpoint.stop()
            raise
        self.log(f"restarting rollout server {name} ({self.restarts.describe(number)})")
        assert isinstance(endpoint, RayEndpoint)
        lost = _Placement(endpoint.info.node_id, endpoint.info.node_ip)
        if endpoint.actor_alive and endpoint.dead.is_set():
            # Its server exited, its actor and node are fine: start the server there again.
            await endpoint.stop(kill=False)
            new = await self._serve(name, endpoint.actor, lost)
        else:
            await endpoint.stop()
            nodes = await asyncio.to_thread(self._alive_nodes)
            placement = self._least_used(nodes, avoid=lost.node_id)
            if placement is None:
                raise SiteExhausted("the Ray cluster has no alive node left")
            self.log(
                f"placing rollout server {name} on {placement.node_ip} ({placement.node_id[:12]})"
            )
            new = await self._launch(name, placement)
        self._endpoints.append(new)
        return new

    def _least_used(self, nodes: list[_Placement], *, avoid: str) -> _Placement | None:
        # Ray may still list the node just lost as alive (it notices within seconds).
        choices = [n for n in nodes if n.node_id != avoid] or nodes
        if not choices:
            return None
        load = {n.node_id: 0 for n in choices}
        for endpoint in self._endpoints:
            if endpoint.info.node_id in load:
                load[endpoint.info.node_id] += 1
        return min(choices, key=lambda n: load[n.node_id])

    async def stop(self) -> None:
        """Stop every replica, disconnect from the cluster, remove the shipped zip."""
        endpoints, self._endpoints = self._endpoints, []
        await asyncio.gather(*(e.stop() for e in endpoints), return_exceptions=True)
        if self._connected:
            self._connected = False
            await asyncio.to_thread(self.ray.shutdown)
        restore, self._restore = self._restore, None
        if restore is not None:
            restore()
        scratch, self._scratch = self._scratch, None
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)

    async def __aenter__(self) -> RaySite:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- for the endpoints ----------------------------------------------------------------------
    def emit(self, line: str) -> None:
        with contextlib.suppress(Exception):  # a failing log must not end the forwarding
            self.log(self.redactor.redact(line))

    def take_trial_here(self, rollout_id: str, source: Path) -> None:
        """Move a trial from a node on this machine: as the actor would ship it (regular
        files within the limits, links never followed), the node's copy removed."""
        try:
            trial = collect_trial(source, self.trial_limits)
        finally:
            shutil.rmtree(source, ignore_errors=True)  # rmtree never follows links
        if trial.files or trial.skipped:
            self.store_trial(rollout_id, trial)

    def store_trial(self, rollout_id: str, trial: TrialFiles) -> None:
        write_trial(trial, self.trials_root / rollout_id, self.trial_limits)
        if trial.skipped:
            shown = "; ".join(f"{s.path}: {s.reason}" for s in trial.skipped[:5])
            self.emit(f"trial {rollout_id}: {len(trial.skipped)} files not shipped ({shown})")


def direct_candidate(info: ReplicaInfo, *, local_ip: str | None, host: str | None) -> str:
    """The URL at which the engine tries `info`'s server: its own (loopback) URL when the
    node is this machine, else the node's address with the server's port; `host` replaces
    either.

    direct_candidate(info, local_ip="10.0.0.5", host=None)  # 'http://10.0.0.7:8123'
    """
    from osmosis.loopback import is_loopback

    parts = urlsplit(info.base_url)
    if host is None:
        if info.node_ip == local_ip or is_loopback(info.node_ip):
            return info.base_url
        host = info.node_ip
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address
    return f"{parts.scheme}://{host}:{parts.port}"


async def _probe(url: str, info: ReplicaInfo) -> str | None:
    """Why `url` is not `info`'s server as seen from here, if it is not: it must answer
    GET /health within `_PROBE_SEC` with the instance id the actor saw."""
    client = RolloutClient(url, transport_retries=0)
    try:
        health = await asyncio.wait_for(client.health(), _PROBE_SEC)
    except TimeoutError:
        return f"no answer within {_PROBE_SEC:g} s"
    except Exception as error:
        return _first_line(error)
    finally:
        with contextlib.suppress(Exception):
            await client.aclose()
    expected = info.health.get("instance_id")
    if expected is not None and health.get("instance_id") != expected:
        return "another server answers there"
    return None


def _shared_trials_dir(info: ReplicaInfo) -> Path | None:
    """`info`'s trial directory if this process sees the node's own (its token file reads
    the same here), else None: another machine, or a private /tmp."""
    if not info.trials_dir or not info.trials_token:
        return None
    directory = Path(info.trials_dir)
    try:
        with open(directory / TRIALS_TOKEN_FILE, encoding="utf-8") as token:
            same = token.read(256) == info.trials_token
    except (OSError, ValueError):  # unreadable here, or not the text the actor wrote
        return None
    return directory if same else None


def _plain_id(rollout_id: str) -> bool:
    return bool(rollout_id) and "/" not in rollout_id and not rollout_id.startswith(".")


def _store_trials(site: RaySite, trials: Mapping[str, TrialFiles]) -> None:
    for rollout_id, files in trials.items():
        site.store_trial(rollout_id, files)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else type(error).__name__


__all__ = [
    "RAY_EXTRA_HINT",
    "SERVER_HOST_ENV",
    "RayEndpoint",
    "RaySite",
    "RayStartError",
    "RayUnavailable",
    "bridge_reach_problem",
    "direct_candidate",
    "import_ray",
]
