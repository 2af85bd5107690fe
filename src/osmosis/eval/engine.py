"""The one evaluation engine: dispatch every pending attempt to a rollout server and record it.

Hosts (`osmosis eval run`, the platform worker, Ray) give it a rollout client, a bridge, the
work and a results sink; nothing here knows which host it runs under.

    engine = Engine(rollout=client, bridge=bridge, sink=sink, settings=settings)
    outcome = await engine.run(work_items)

Failure is explicit: an attempt ends `success`, `failed` (with an error type) or `skipped`.
A fault of the system rather than of the attempt (dead rollout server, provider outage, a
5xx admission) halts dispatch and leaves the affected attempts pending — never recorded as
failures — so a resume picks them up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from osmosis._version import __version__
from osmosis.eval.records import AttemptRecord
from osmosis.eval.rollout_client import (
    AdmissionRejected,
    ResultDeadlineExceeded,
    RolloutClient,
    RolloutServerUnavailable,
)
from osmosis.rollout.protocol import RolloutInitRequest, RolloutResultResponse
from osmosis.rollout.trajectory import build_trajectory
from osmosis.rollout.types import ErrorCategory, Messages, RolloutStatus

PROTOCOL_ERROR = "rollout_protocol_error"
"""The error type of an attempt whose admission the rollout server refused with a 4xx."""

SUPERVISOR_GRACE_SEC = 60.0
"""Beyond the agent and grader deadlines, how long the engine waits for a result."""


@dataclass(frozen=True)
class WorkItem:
    """One attempt to make: a selected row and which of its `n` attempts this is."""

    row_index: int
    run_index: int
    source_row_index: int
    messages: Messages
    label: str | None
    metadata: dict[str, Any] | None


@dataclass(frozen=True)
class FinishedAttempt:
    """What the sink stores for one attempt."""

    record: AttemptRecord
    trajectory: dict[str, Any] | None
    """The ATIF document, enriched with the bridge's per-call tokens, cost and latency."""
    trial_dir: Path | None
    """Where the rollout wrote `artifacts/` for this attempt, if anywhere."""


class ResultsSink(Protocol):
    """Where finished attempts go. `record` must be durable when it returns."""

    def record(self, attempt: FinishedAttempt) -> None: ...

    def log(self, line: str) -> None: ...


class PolicyCall(Protocol):
    """What the engine reads of one bridge call (see `osmosis.eval.bridge.CallRecord`)."""

    @property
    def prompt_tokens(self) -> int | None: ...
    @property
    def completion_tokens(self) -> int | None: ...
    @property
    def cost_usd(self) -> float | None: ...
    @property
    def latency_ms(self) -> float: ...
    @property
    def model(self) -> str | None: ...
    @property
    def status_code(self) -> int: ...
    @property
    def response_message(self) -> Mapping[str, Any] | None: ...


class PolicyBridge(Protocol):
    """What the engine needs of the model bridge."""

    @property
    def token(self) -> str: ...

    @property
    def outage(self) -> asyncio.Event: ...

    @property
    def outage_reason(self) -> str | None: ...

    def rollout_url(self, rollout_id: str) -> str: ...

    def take_calls(self, rollout_id: str) -> Sequence[PolicyCall]: ...

    def forget(self, rollout_id: str) -> None: ...


@dataclass(frozen=True)
class EngineSettings:
    """How to run: concurrency, deadlines and where rollout trials land."""

    concurrency: int
    agent_timeout_sec: float | None
    grader_timeout_sec: float | None
    artifact_root: Path | None = None
    """The rollout server's `_OSMOSIS_ROLLOUT_ARTIFACT_ROOT` (trajectories and artifacts)."""

    @property
    def supervisor_deadline_sec(self) -> float:
        if self.agent_timeout_sec is None or self.grader_timeout_sec is None:
            return 3600.0
        return self.agent_timeout_sec + self.grader_timeout_sec + SUPERVISOR_GRACE_SEC


@dataclass(frozen=True)
class EngineOutcome:
    """How a dispatch ended. `halted` carries the reason when a system fault stopped it."""

    dispatched: int
    recorded: int
    pending: int
    halted: str | None = None
    interrupted: bool = False


class HaltSignal(Protocol):
    """Something whose event means "stop dispatching" (a dead rollout process, say)."""

    @property
    def event(self) -> asyncio.Event: ...

    @property
    def reason(self) -> str: ...


class _Halt(Exception):
    """An attempt hit a process-wide fault: leave it pending and stop dispatching."""


class Engine:
    """Evaluates work items against one rollout server through one bridge."""

    def __init__(
        self,
        *,
        rollout: RolloutClient,
        bridge: PolicyBridge,
        sink: ResultsSink,
        settings: EngineSettings,
        halt_signals: Iterable[HaltSignal] = (),
        on_record: Callable[[AttemptRecord], None] | None = None,
    ) -> None:
        self.rollout = rollout
        self.bridge = bridge
        self.sink = sink
        self.settings = settings
        self.halt_signals = list(halt_signals)
        self.on_record = on_record
        self._halt_reason: str | None = None
        self._halted = asyncio.Event()
        self._in_flight: set[str] = set()

    @property
    def halt_reason(self) -> str | None:
        return self._halt_reason

    def halt(self, reason: str) -> None:
        """Stop dispatching; attempts still in flight finish or stay pending."""
        if self._halt_reason is None:
            self._halt_reason = reason
            self.sink.log(f"halting dispatch: {reason}")
        self._halted.set()

    async def run(self, items: Iterable[WorkItem] | AsyncIterator[WorkItem]) -> EngineOutcome:
        """Dispatch every item with at most `concurrency` in flight; returns when all
        dispatched attempts ended or a halt drained them."""
        slots = asyncio.Semaphore(self.settings.concurrency)
        tasks: set[asyncio.Task[bool]] = set()
        dispatched = recorded = 0
        watchers = [asyncio.create_task(self._watch(signal)) for signal in self.halt_signals]
        watchers.append(asyncio.create_task(self._watch_bridge()))
        interrupted = False
        try:
            async for item in _aiter(items):
                await slots.acquire()
                if self._halted.is_set():
                    slots.release()
                    break
                dispatched += 1
                task = asyncio.create_task(self._attempt(item))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                task.add_done_callback(lambda _: slots.release())
            results = await asyncio.gather(*tasks, return_exceptions=True)
            recorded = sum(1 for r in results if r is True)
        except asyncio.CancelledError:
            interrupted = True
            await self._cancel_in_flight(tasks)
            raise
        finally:
            for watcher in watchers:
                watcher.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
        return EngineOutcome(
            dispatched=dispatched,
            recorded=recorded,
            pending=dispatched - recorded,
            halted=self._halt_reason,
            interrupted=interrupted,
        )

    # -- one attempt ------------------------------------------------------------------------
    async def _attempt(self, item: WorkItem) -> bool:
        """Run one attempt; True when its record was written."""
        rollout_id = uuid.uuid4().hex
        started = time.monotonic()
        self._in_flight.add(rollout_id)
        try:
            result = await self._dispatch(item, rollout_id)
        except _Halt:
            self.bridge.forget(rollout_id)
            return False
        finally:
            self._in_flight.discard(rollout_id)
        duration_ms = (time.monotonic() - started) * 1000
        calls = list(self.bridge.take_calls(rollout_id))
        self.bridge.forget(rollout_id)  # memory follows what is in flight, not what is done
        if result.status is not RolloutStatus.SUCCESS and self._system_fault(calls):
            # The failure came from the provider or the platform, not the rollout: pending.
            return False
        record = _classify(item, rollout_id, result, calls, duration_ms)
        trajectory = self._trajectory(item, rollout_id, result, record, calls)
        trial_dir = (
            self.settings.artifact_root / rollout_id if self.settings.artifact_root else None
        )
        self.sink.record(FinishedAttempt(record=record, trajectory=trajectory, trial_dir=trial_dir))
        if self.on_record is not None:
            self.on_record(record)
        return True

    async def _dispatch(self, item: WorkItem, rollout_id: str) -> RolloutResultResponse:
        request = RolloutInitRequest(
            rollout_id=rollout_id,
            initial_messages=item.messages,
            label=item.label,
            metadata=item.metadata,
            chat_completions_url=self.bridge.rollout_url(rollout_id),
            llm_api_key=self.bridge.token,
            agent_timeout_sec=self.settings.agent_timeout_sec,
            grader_timeout_sec=self.settings.grader_timeout_sec,
            extra_fields={"row_index": item.row_index, "run_index": item.run_index},
        )
        try:
            lease = await self.rollout.start(request)
        except AdmissionRejected as rejected:
            # This one rollout was refused (4xx): its failure, not the process's.
            return RolloutResultResponse(
                rollout_id=rollout_id,
                status=RolloutStatus.FAILURE,
                err_message=f"{PROTOCOL_ERROR}: {rejected}",
            )
        except RolloutServerUnavailable as fault:
            self.halt(str(fault))
            raise _Halt from fault
        try:
            return await self.rollout.wait(
                lease, deadline_sec=self.settings.supervisor_deadline_sec
            )
        except ResultDeadlineExceeded as exceeded:
            await self._cancel_quietly([rollout_id])
            return RolloutResultResponse(
                rollout_id=rollout_id,
                status=RolloutStatus.FAILURE,
                err_message=str(exceeded),
                err_category=ErrorCategory.TIMEOUT,
            )
        except RolloutServerUnavailable as fault:
            self.halt(str(fault))
            raise _Halt from fault

    def _system_fault(self, calls: Sequence[PolicyCall]) -> bool:
        if self.bridge.outage.is_set():
            return True
        # The bridge answers 502/503 only when the provider stayed down through its retries.
        return any(call.status_code in (502, 503) for call in calls)

    # -- halting and cancelling ---------------------------------------------------------------
    async def _watch(self, signal: HaltSignal) -> None:
        await signal.event.wait()
        self.halt(signal.reason)
        await self._cancel_quietly(list(self._in_flight))

    async def _watch_bridge(self) -> None:
        await self.bridge.outage.wait()
        self.halt(f"model provider unavailable: {self.bridge.outage_reason or 'outage'}")

    async def _cancel_in_flight(self, tasks: set[asyncio.Task[bool]]) -> None:
        # Interrupted (Ctrl-C, eval stop): record nothing more, all pending. Our tasks go
        # first: while the server's cancel call is awaited, a task could still record the
        # "cancelled" result that very call produces, as a failed attempt.
        rollout_ids = list(self._in_flight)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._cancel_quietly(rollout_ids)

    async def _cancel_quietly(self, rollout_ids: list[str]) -> None:
        if not rollout_ids:
            return
        # The server may be gone or stuck; then there is nothing more to stop.
        with contextlib.suppress(TimeoutError, RolloutServerUnavailable, OSError):
            await asyncio.wait_for(self.rollout.cancel(rollout_ids), timeout=5)

    # -- trajectories -----------------------------------------------------------------------
    def _trajectory(
        self,
        item: WorkItem,
        rollout_id: str,
        result: RolloutResultResponse,
        record: AttemptRecord,
        calls: Sequence[PolicyCall],
    ) -> dict[str, Any] | None:
        document = self._read_rollout_trajectory(rollout_id)
        if document is None:
            messages = result.sample.messages if result.sample is not None else item.messages
            document = build_trajectory(
                rollout_id=rollout_id,
                messages=list(messages),
                agent_version=__version__,
                osmosis={
                    "rollout_id": rollout_id,
                    "label": item.label,
                    "reward": record.reward,
                    "request_metadata": item.metadata,
                },
            )
        return enrich_trajectory(document, calls, record)

    def _read_rollout_trajectory(self, rollout_id: str) -> dict[str, Any] | None:
        if self.settings.artifact_root is None:
            return None
        path = self.settings.artifact_root / rollout_id / "trajectory.json"
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return document if isinstance(document, dict) else None


def _classify(
    item: WorkItem,
    rollout_id: str,
    result: RolloutResultResponse,
    calls: Sequence[PolicyCall],
    duration_ms: float,
) -> AttemptRecord:
    """Map a rollout result to an attempt record, as the reference classifies outcomes."""
    sample = result.sample
    error_type: str | None = None
    error_message: str | None = None
    reward: float | None = None
    if result.status is not RolloutStatus.SUCCESS:
        status = "failed"
        if result.err_message and result.err_message.startswith(PROTOCOL_ERROR):
            error_type = PROTOCOL_ERROR
        elif result.err_category is not None:
            error_type = str(result.err_category.value)
        else:
            error_type = result.err_message or "rollout_failed"
        error_message = result.err_message
    elif sample is not None and sample.remove_sample:
        status = "skipped"
    else:
        status = "success"
        reward = sample.reward if sample is not None else None
    prompt = sum(call.prompt_tokens or 0 for call in calls)
    completion = sum(call.completion_tokens or 0 for call in calls)
    costs = [call.cost_usd for call in calls if call.cost_usd is not None]
    return AttemptRecord(
        row_index=item.row_index,
        run_index=item.run_index,
        rollout_id=rollout_id,
        source_row_index=item.source_row_index,
        status=status,
        reward=float(reward) if reward is not None else None,
        tokens=prompt + completion,
        prompt_tokens=prompt,
        completion_tokens=completion,
        cost_usd=float(sum(costs)) if costs else None,
        duration_ms=round(duration_ms, 3),
        error_type=error_type,
        error_message=error_message,
        trajectory_filename="trajectory.json",
        finished_at=datetime.now(UTC),
    )


def enrich_trajectory(
    document: dict[str, Any], calls: Sequence[PolicyCall], record: AttemptRecord
) -> dict[str, Any]:
    """Add the bridge's per-call tokens, cost and latency: the authoritative accounting."""
    agent_steps = [s for s in document.get("steps", []) if s.get("source") == "agent"]
    remaining = list(calls)
    for step in agent_steps:
        for index, call in enumerate(remaining):
            response = call.response_message or {}
            if response.get("content") in (step.get("message"), None) or not step.get("message"):
                metrics = dict(step.get("metrics") or {})
                metrics.update(
                    {
                        key: value
                        for key, value in (
                            ("prompt_tokens", call.prompt_tokens),
                            ("completion_tokens", call.completion_tokens),
                            ("cost_usd", call.cost_usd),
                            ("latency_ms", round(call.latency_ms, 3)),
                        )
                        if value is not None
                    }
                )
                step["metrics"] = metrics
                if call.model:
                    step["model_name"] = call.model
                del remaining[index]
                break
    final = dict(document.get("final_metrics") or {})
    final.update(
        total_prompt_tokens=record.prompt_tokens or 0,
        total_completion_tokens=record.completion_tokens or 0,
        total_policy_calls=len(calls),
    )
    if record.cost_usd is not None:
        final["total_cost_usd"] = record.cost_usd
    document["final_metrics"] = final
    osmosis = document.setdefault("extra", {}).setdefault("osmosis", {})
    osmosis.update(
        row_index=record.row_index,
        run_index=record.run_index,
        status=record.status,
        error_type=record.error_type,
        policy_calls=[
            {
                "model": call.model,
                "status_code": call.status_code,
                "prompt_tokens": call.prompt_tokens,
                "completion_tokens": call.completion_tokens,
                "cost_usd": call.cost_usd,
                "latency_ms": round(call.latency_ms, 3),
            }
            for call in calls
        ],
    )
    return document


async def _aiter(items: Iterable[WorkItem] | AsyncIterator[WorkItem]) -> AsyncIterator[WorkItem]:
    if isinstance(items, AsyncIterator):
        async for item in items:
            yield item
    else:
        for item in items:
            yield item
