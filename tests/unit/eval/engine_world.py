"""An in-memory world for the engine: rollout endpoints, a site, a bridge and a sink.

Each work item's `metadata["kind"]` says what its rollout does (see `MemoryAPI.wait`), so a
test reads as a table of kinds and the outcomes a user would see. Nothing here sleeps longer
than a few milliseconds: the whole engine table runs in well under a second.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from osmosis.eval.engine import Engine, EngineOutcome, EngineSettings
from osmosis.eval.results.records import FinishedAttempt, WorkItem
from osmosis.eval.sites import (
    AdmissionRejected,
    AtCapacity,
    Lease,
    ResultDeadlineExceeded,
    RolloutServerUnavailable,
    SiteExhausted,
    parse_result,
)
from osmosis.rollout.protocol import RolloutInitRequest, RolloutResultResponse

QUICK = EngineSettings(
    concurrency=4,
    agent_timeout_sec=0.01,
    grader_timeout_sec=0.01,
    supervisor_grace_sec=0.01,
    verdict_wait_sec=1.0,
    outage_wait_sec=1.0,
)


@dataclass(frozen=True)
class Call:
    """One model call as the bridge records it (the engine's `PolicyCall`)."""

    status_code: int = 200
    prompt_tokens: int | None = 3
    completion_tokens: int | None = 2
    cost_usd: float | None = None
    latency_ms: float = 1.0
    model: str | None = "memory-model"
    response_message: dict[str, Any] | None = None


class MemoryBridge:
    """The bridge's side of INTERFACES.md §2, driven by the test."""

    token = "bridge-token"

    def __init__(self) -> None:
        self.outage = asyncio.Event()
        self.outage_reason: str | None = None
        self.calls: dict[str, list[Call]] = {}
        self.stuck: set[str] = set()
        self.forgotten: set[str] = set()
        self.opened: set[str] = set()
        self.closed: set[str] = set()
        self.taken_open: set[str] = set()
        self._cleared = asyncio.Event()

    def open_rollout(self, rollout_id: str) -> str:
        self.opened.add(rollout_id)
        return f"http://bridge.invalid/v1/rollouts/{rollout_id}"

    def close_rollout(self, rollout_id: str) -> None:
        self.closed.add(rollout_id)

    def take_calls(self, rollout_id: str) -> list[Call]:
        if rollout_id not in self.closed:
            self.taken_open.add(rollout_id)  # its calls taken while it could still make more
        return self.calls.pop(rollout_id, [])

    def forget(self, rollout_id: str) -> None:
        self.calls.pop(rollout_id, None)
        self.stuck.discard(rollout_id)
        self.forgotten.add(rollout_id)

    def stuck_rollouts(self) -> set[str]:
        return set(self.stuck)

    def rate_wait(self, rollout_id: str) -> tuple[float, bool]:
        return 0.0, False  # no adaptive limit here

    async def stalled(self, rollout_id: str) -> bool:
        return False  # outages are declared explicitly here (declare_outage)

    def stall_time(self, rollout_id: str) -> float:
        return 0.0  # no probes here: no stall is ever confirmed

    async def wait_recovered(self, timeout: float) -> bool:  # noqa: ASYNC109 - the interface
        try:
            await asyncio.wait_for(self._cleared.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def declare_outage(self, reason: str) -> None:
        self.outage_reason = reason
        self._cleared.clear()
        self.outage.set()

    def recover(self) -> None:
        self.outage.clear()
        self.outage_reason = None
        self.stuck.clear()
        self._cleared.set()


@dataclass
class World:
    """What every endpoint shares: the bridge, and how often each attempt ran."""

    bridge: MemoryBridge = field(default_factory=MemoryBridge)
    tries: Counter[tuple[int, int]] = field(default_factory=Counter)
    served_by: Counter[str] = field(default_factory=Counter)
    peak_load: Counter[str] = field(default_factory=Counter)
    stall_for: float = 0.05  # how long a `stall` outage lasts
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    admitting: int = 0  # admissions being answered right now (rows with an `admit` time)
    admissions: list[tuple[int, int]] = field(default_factory=list)
    """(row, admissions being answered as it arrived, itself included), in arrival order."""

    def later(self, delay: float, action: Callable[[], None]) -> None:
        async def run() -> None:
            await asyncio.sleep(delay)
            action()

        task = asyncio.create_task(run())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


class MemoryAPI:
    """The rollout protocol in memory: each kind of row behaves as `wait` says."""

    def __init__(self, world: World, endpoint: MemoryEndpoint) -> None:
        self.world = world
        self.endpoint = endpoint
        self.requests: dict[str, RolloutInitRequest] = {}
        self.cancelled: list[str] = []
        self.load = 0

    async def health(self) -> dict[str, object]:
        if self.endpoint.dead.is_set():
            raise RolloutServerUnavailable("connection refused")
        return {"status": "ok"}

    async def start(self, request: RolloutInitRequest) -> Lease:
        if self.endpoint.dead.is_set():
            raise RolloutServerUnavailable("connection refused")
        admit = float((request.metadata or {}).get("admit", 0))
        if admit:  # a server slow to admit: how many admissions wait on it at once
            world = self.world
            world.admitting += 1
            world.admissions.append(
                (int((request.extra_fields or {})["row_index"]), world.admitting)
            )
            try:
                await asyncio.sleep(admit)
            finally:
                world.admitting -= 1
        kind, first = self._kind(request)
        if kind == "admission_4xx":
            raise AdmissionRejected(422, "label must be a string")
        if kind == "admission_5xx" and first:
            raise RolloutServerUnavailable("rollout server answered HTTP 503 on admission")
        if kind == "busy_once" and first:
            raise AtCapacity(0.01)
        self.requests[request.rollout_id] = request
        self.load += 1
        name = self.endpoint.name
        self.world.peak_load[name] = max(self.world.peak_load[name], self.load)
        return Lease(request.rollout_id, "lease", 1.0)

    async def wait(
        self, lease: Lease, *, deadline_sec: float | None = None
    ) -> RolloutResultResponse:
        request = self.requests[lease.rollout_id]
        try:
            return await self._run(request, deadline_sec)
        finally:
            self.load -= 1

    async def cancel(self, rollout_ids: list[str]) -> dict[str, str]:
        self.cancelled.extend(rollout_ids)
        return dict.fromkeys(rollout_ids, "cancelled_running")

    async def aclose(self) -> None:
        return None

    def _kind(self, request: RolloutInitRequest) -> tuple[str, bool]:
        extra = request.extra_fields or {}
        key = (int(extra["row_index"]), int(extra["run_index"]))
        self.world.tries[key] += 1
        return str((request.metadata or {}).get("kind", "pass")), self.world.tries[key] == 1

    async def _run(
        self, request: RolloutInitRequest, deadline_sec: float | None
    ) -> RolloutResultResponse:
        world, bridge, rid = self.world, self.world.bridge, request.rollout_id
        kind = str((request.metadata or {}).get("kind", "pass"))
        extra = request.extra_fields or {}
        first = world.tries[(int(extra["row_index"]), int(extra["run_index"]))] == 1
        world.served_by[self.endpoint.name] += 1
        await asyncio.sleep(float((request.metadata or {}).get("sleep", 0.001)))
        bridge.calls.setdefault(rid, []).append(Call())
        reply = {"role": "assistant", "content": "42"}
        if kind == "deadline":
            await asyncio.sleep(deadline_sec or 10)  # the rollout never answers
            raise ResultDeadlineExceeded(f"rollout {rid} gave no result within {deadline_sec}s")
        if kind == "dies" and first:
            self.endpoint.die("rollout server 'memory' exited unexpectedly (code -9)")
            raise RolloutServerUnavailable("connection reset by peer")
        if kind == "bridge_503" and first:
            bridge.calls[rid] = [Call(status_code=503, prompt_tokens=None, completion_tokens=None)]
            return _result(rid, "failure", err_message="upstream 503", err_category="agent_error")
        if kind == "stall" and first:
            # The provider stops answering: the agent's own deadline expires while its model
            # call is still outstanding, and only then does the bridge declare the outage.
            bridge.stuck.add(rid)
            world.later(0.02, lambda: bridge.declare_outage("no provider response for 2 s"))
            world.later(0.02 + world.stall_for, bridge.recover)
            return _result(rid, "failure", err_message="agent timed out", err_category="timeout")
        if kind == "agent_error":
            return _result(
                rid, "failure", err_message="ValueError: bad", err_category="agent_error"
            )
        if kind == "remove_sample":
            sample = {"messages": [*request.initial_messages, reply], "remove_sample": True}
            return _result(rid, "success", sample=sample)
        if kind == "nan_reward":
            body = json.dumps(
                {
                    "rollout_id": rid,
                    "status": "success",
                    "sample": {"messages": [reply], "reward": 0},
                }
            ).replace('"reward": 0', '"reward": NaN')
            return parse_result(body.encode())
        if kind == "malformed":
            return parse_result(b'{"rollout_id": "x", "status": "finished-ish"}')
        if kind == "explodes":
            raise RuntimeError("the rollout client has a bug")
        return _result(
            rid, "success", sample={"messages": [*request.initial_messages, reply], "reward": 1.0}
        )


def _result(rollout_id: str, status: str, **fields: Any) -> RolloutResultResponse:
    return RolloutResultResponse.model_validate(
        {"rollout_id": rollout_id, "status": status, **fields}
    )


class MemoryEndpoint:
    """An endpoint of the in-memory site."""

    def __init__(self, world: World, name: str, *, capacity: int | None = None) -> None:
        self.name = name
        self.node = "memory-node"
        self.base_url = f"memory://{name}"
        self.capacity = capacity
        self.dead = asyncio.Event()
        self.death_reason = ""
        self.breach = None
        self.api = MemoryAPI(world, self)

    def die(self, reason: str) -> None:
        self.death_reason = reason
        self.dead.set()

    async def trial(self, rollout_id: str) -> None:
        return None


class MemorySite:
    """Endpoints in memory; `replace` starts a fresh one under the same name, twice at most."""

    def __init__(
        self, world: World, count: int = 1, *, capacity: int | None = None, restarts: int = 2
    ) -> None:
        self.world = world
        self.capacity = capacity
        self.restarts = restarts
        self.replaced: list[str] = []
        self._endpoints = [
            MemoryEndpoint(world, f"memory-{index}", capacity=capacity) for index in range(count)
        ]

    @property
    def endpoints(self) -> list[MemoryEndpoint]:
        return list(self._endpoints)

    async def replace(self, endpoint: MemoryEndpoint, reason: str) -> MemoryEndpoint:
        self._endpoints.remove(endpoint)
        if len(self.replaced) >= self.restarts:
            raise SiteExhausted(f"restarted {len(self.replaced)} times already")
        self.replaced.append(endpoint.name)
        fresh = MemoryEndpoint(self.world, endpoint.name, capacity=self.capacity)
        self._endpoints.append(fresh)
        return fresh


class MemorySink:
    """Keeps what the engine stores; `fail_on` makes `store` raise for that row; a store
    takes `store_sec` (a disk), and `on_store` is called as each one begins."""

    def __init__(
        self,
        fail_on: int | None = None,
        *,
        store_sec: float = 0.0,
        on_store: Callable[[FinishedAttempt], None] | None = None,
    ) -> None:
        self.attempts: list[FinishedAttempt] = []
        self.lines: list[str] = []
        self.fail_on = fail_on
        self.store_sec = store_sec
        self.on_store = on_store

    async def store(self, attempt: FinishedAttempt) -> None:
        if self.on_store is not None:
            self.on_store(attempt)
        if attempt.record.row_index == self.fail_on:
            raise OSError(28, "No space left on device")
        if self.store_sec:
            await asyncio.sleep(self.store_sec)
        self.attempts.append(attempt)

    def log(self, line: str) -> None:
        self.lines.append(line)


def item(row: int, kind: str = "pass", run: int = 0, **metadata: object) -> WorkItem:
    return WorkItem(
        row_index=row,
        run_index=run,
        source_row_index=row,
        messages=[{"role": "user", "content": f"row {row}"}],
        label="42",
        metadata={"kind": kind, **metadata},
    )


async def evaluate(
    items: list[WorkItem],
    *,
    world: World | None = None,
    site: MemorySite | None = None,
    sink: MemorySink | None = None,
    settings: EngineSettings = QUICK,
) -> tuple[EngineOutcome, MemorySink, World, MemorySite]:
    world = world or World()
    site = site or MemorySite(world)
    sink = sink or MemorySink()
    engine = Engine(site=site, bridge=world.bridge, sink=sink, settings=settings)
    try:
        outcome = await engine.run(items)
    finally:
        for task in world.tasks:
            task.cancel()
    return outcome, sink, world, site
