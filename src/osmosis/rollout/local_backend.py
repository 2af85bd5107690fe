"""`LocalBackend`: runs workflow and grader in this process, under a concurrency limit."""

from __future__ import annotations

import asyncio
import copy
import importlib
import logging
import os
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from osmosis._version import __version__
from osmosis.rollout.artifacts_dir import PendingDirectory
from osmosis.rollout.backend import (
    ExecutionBackend,
    ExecutionOutcome,
    ExecutionRequest,
    ExecutionResult,
)
from osmosis.rollout.configs import AgentWorkflowConfig, GraderConfig
from osmosis.rollout.context import RolloutContext, get_rollout_context
from osmosis.rollout.errors import categorize_exception
from osmosis.rollout.grader import REWARD_EXPLANATION, Grader, GraderContext, require_reward
from osmosis.rollout.sample import RolloutSample
from osmosis.rollout.trajectory import build_trajectory, write_trajectory
from osmosis.rollout.types import ErrorCategory, RolloutStatus
from osmosis.rollout.workflow import AgentWorkflow, AgentWorkflowContext, coerce_output

logger = logging.getLogger("osmosis.rollout")

ARTIFACT_ROOT_ENV = "_OSMOSIS_ROLLOUT_ARTIFACT_ROOT"
DEFAULT_MAX_CONCURRENT = 4


class LocalBackend(ExecutionBackend):
    """Run rollouts in-process.

        backend = LocalBackend(workflow=Multiply, grader=ExactMatch)
        app = create_rollout_server(backend=backend)

    `workflow`, `grader` and the configs may be classes/objects or import strings
    (`"package.module:Name"`). Concurrency comes from `workflow_config.concurrency`
    (default 4; None is unbounded); rollouts beyond it wait in a queue whose time counts
    against their agent deadline. With `max_pending`, the backend reports no capacity
    (the server answers 429) once that many rollouts are queued or running.
    """

    def __init__(
        self,
        *,
        workflow: type[AgentWorkflow[Any]] | str,
        workflow_config: AgentWorkflowConfig | str | None = None,
        grader: type[Grader] | str | None = None,
        grader_config: GraderConfig | str | None = None,
        max_pending: int | None = None,
        artifact_root: Path | str | None = None,
    ) -> None:
        self.workflow_cls: type[AgentWorkflow[Any]] = _resolve(workflow)
        self.workflow_config: AgentWorkflowConfig | None = (
            _resolve(workflow_config) if workflow_config is not None else None
        )
        self.grader_cls: type[Grader] | None = _resolve(grader) if grader is not None else None
        self.grader_config: GraderConfig | None = (
            _resolve(grader_config) if grader_config is not None else None
        )
        if max_pending is not None and max_pending < 1:
            raise ValueError("max_pending must be at least 1")
        self.max_pending = max_pending
        self.max_concurrent: int | None = (
            self.workflow_config.concurrency.max_concurrent
            if self.workflow_config is not None
            else DEFAULT_MAX_CONCURRENT
        )
        self._slots = asyncio.Semaphore(self.max_concurrent) if self.max_concurrent else None
        self._queued = 0
        self._running = 0
        root = artifact_root or os.environ.get(ARTIFACT_ROOT_ENV)
        self.artifact_root = Path(root) if root else Path.home() / ".osmosis" / "rollouts"

    # -- ExecutionBackend -------------------------------------------------------------------
    def has_capacity(self) -> bool:
        return self.max_pending is None or self._queued + self._running < self.max_pending

    def health(self) -> dict[str, Any]:
        concurrency: dict[str, Any] = {
            "max_concurrent": self.max_concurrent,
            "queued": self._queued,
            "running": self._running,
        }
        if self.max_pending is not None:
            concurrency["max_pending"] = self.max_pending
        return {"status": "ok", "concurrency": concurrency}

    async def execute(self, request: ExecutionRequest) -> ExecutionOutcome:
        rollout = get_rollout_context() or RolloutContext(rollout_id=request.id)
        self._queued += 1
        try:
            if self._slots is not None:
                await self._slots.acquire()
        finally:
            self._queued -= 1
        self._running += 1
        try:
            rollout.set_status(RolloutStatus.RUNNING)
            outcome = await self._execute(request, rollout)
        finally:
            self._running -= 1
            if self._slots is not None:
                self._slots.release()
        self._save_trajectory(request, rollout, outcome)
        return outcome

    # -- phases -----------------------------------------------------------------------------
    async def _execute(
        self, request: ExecutionRequest, rollout: RolloutContext
    ) -> ExecutionOutcome:
        artifacts_dir = self._artifacts_dir(request.id)
        workflow = await self._run_workflow(request, rollout, artifacts_dir)
        if not request.grade or workflow.status is not RolloutStatus.SUCCESS:
            return ExecutionOutcome(workflow=workflow)
        if self.grader_cls is None or (request.label is None and request.metadata is None):
            # Nothing to grade against: a failure without a message, as the reference SDK does.
            return ExecutionOutcome(
                workflow=workflow, grader=ExecutionResult(status=RolloutStatus.FAILURE)
            )
        rollout.set_status(RolloutStatus.GRADING)
        graded = await self._run_grader(request, workflow.sample, artifacts_dir)
        return ExecutionOutcome(workflow=workflow, grader=graded)

    async def _run_workflow(
        self, request: ExecutionRequest, rollout: RolloutContext, artifacts_dir: PendingDirectory
    ) -> ExecutionResult:
        # The controller's clock started at submission: queue time comes out of the budget.
        queued_sec = time.monotonic() - request.submitted_at
        budget = (
            max(request.agent_timeout_sec - queued_sec, 0.0)
            if request.agent_timeout_sec is not None
            else None
        )
        config = copy.deepcopy(self.workflow_config)
        ctx: AgentWorkflowContext[Any] = AgentWorkflowContext(
            prompt=_json_copy(request.prompt),
            config=config,
            metadata=_json_copy(request.metadata),
            artifacts_dir=artifacts_dir,
        )
        started = time.monotonic()
        deadline = _Deadline(budget)
        try:
            with deadline, rollout:
                output = coerce_output(await self.workflow_cls(config).run(ctx))
                if output is None:
                    sample: RolloutSample | None = await rollout.get_sample()
                elif output.messages is not None:
                    sample = RolloutSample(messages=output.messages, metrics=dict(output.metrics))
                else:
                    sample = None
        except Exception as exc:
            message = _failure_message(
                exc, deadline.expired(), "workflow", request.agent_timeout_sec, queued_sec
            )
            _log_failure(exc, deadline.expired(), f"workflow of rollout {request.id}", message)
            return ExecutionResult(
                status=RolloutStatus.FAILURE,
                err_message=message,
                err_category=categorize_exception(exc),
            )
        if budget is not None and (deadline.expired() or time.monotonic() - started > budget):
            # Code that blocked the loop or swallowed cancellation returned late: a result the
            # controller stopped waiting for is a timeout, not a success.
            return ExecutionResult(
                status=RolloutStatus.FAILURE,
                err_message=_deadline_message("workflow", request.agent_timeout_sec, queued_sec),
                err_category=ErrorCategory.TIMEOUT,
            )
        if sample is not None and sample.label is None:
            sample.label = request.label
        return ExecutionResult(status=RolloutStatus.SUCCESS, sample=sample)

    async def _run_grader(
        self,
        request: ExecutionRequest,
        sample: RolloutSample | None,
        artifacts_dir: PendingDirectory,
    ) -> ExecutionResult:
        assert self.grader_cls is not None
        ctx = GraderContext(
            label=request.label,
            sample=sample,
            metadata=_json_copy(request.metadata),
            artifacts_dir=artifacts_dir,
        )
        budget = request.grader_timeout_sec  # a full window of its own, after the workflow
        started = time.monotonic()
        deadline = _Deadline(budget)
        try:
            with deadline:
                await self.grader_cls(self.grader_config).grade(ctx)
            require_reward(ctx.sample)
        except Exception as exc:
            message = _failure_message(exc, deadline.expired(), "grader", budget, 0.0)
            _log_failure(exc, deadline.expired(), f"grader of rollout {request.id}", message)
            return ExecutionResult(
                status=RolloutStatus.FAILURE,
                sample=ctx.sample,
                err_message=message,
                err_category=categorize_exception(exc),
            )
        if budget is not None and (deadline.expired() or time.monotonic() - started > budget):
            return ExecutionResult(
                status=RolloutStatus.FAILURE,
                sample=ctx.sample,
                err_message=_deadline_message("grader", budget, 0.0),
                err_category=ErrorCategory.TIMEOUT,
            )
        return ExecutionResult(status=RolloutStatus.SUCCESS, sample=ctx.sample)

    # -- files ------------------------------------------------------------------------------
    def _artifacts_dir(self, rollout_id: str) -> PendingDirectory:
        # Created when the workflow or grader first reads ctx.artifacts_dir: most never do.
        return PendingDirectory(self.artifact_root / rollout_id / "artifacts")

    def _save_trajectory(
        self, request: ExecutionRequest, rollout: RolloutContext, outcome: ExecutionOutcome
    ) -> None:
        result = outcome.result
        sample = result.sample or outcome.workflow.sample
        messages = (sample.trajectory_messages if sample is not None else None) or []
        if sample is not None and sample.trajectory_messages is None:
            return  # the workflow disabled trajectory persistence explicitly
        succeeded = result.status is RolloutStatus.SUCCESS
        reward = (
            sample.reward if sample is not None and succeeded and not sample.remove_sample else None
        )
        document = build_trajectory(
            rollout_id=request.id,
            messages=messages,
            calls=rollout.recorder.calls,
            agent_version=__version__,
            osmosis={
                "rollout_id": request.id,
                "status": result.status.value,
                "label": request.label,
                "reward": reward,
                "remove_sample": bool(sample and sample.remove_sample),
                "err_message": result.err_message,
                "err_category": result.err_category.value if result.err_category else None,
                "sample_metrics": sample.wire_copy().metrics if sample is not None else {},
                "reward_explanation": (
                    sample.extra_fields.get(REWARD_EXPLANATION) if sample is not None else None
                ),
                "request_metadata": request.metadata,
                "request_extra_fields": request.extra_fields,
            },
        )
        if request.return_trajectory:
            outcome.trajectory = document  # the server sends it with the result: no file
        else:
            write_trajectory(self.artifact_root / request.id / "trajectory.json", document)


class _Deadline:
    """`asyncio.timeout(seconds)` for one phase (None: no limit), as a plain `with` with one
    timer: a third of its cost, paid twice per attempt. At the deadline the task is
    cancelled; leaving the block turns that cancellation into `TimeoutError`."""

    __slots__ = ("_cancelling", "_expired", "_handle", "_seconds", "_task")

    def __init__(self, seconds: float | None) -> None:
        self._seconds = seconds
        self._task: asyncio.Task[Any] | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._cancelling = 0
        self._expired = False

    def __enter__(self) -> _Deadline:
        if self._seconds is not None:
            task = asyncio.current_task()
            assert task is not None, "a deadline needs a task"
            self._task, self._cancelling = task, task.cancelling()
            self._handle = asyncio.get_running_loop().call_later(self._seconds, self._fire)
        return self

    def _fire(self) -> None:
        assert self._task is not None
        self._expired = True
        self._task.cancel()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if (
            self._expired
            and self._task is not None
            and self._task.uncancel() <= self._cancelling
            and exc_type is asyncio.CancelledError
        ):
            raise TimeoutError from exc  # ours, not a cancellation from outside

    def expired(self) -> bool:
        """Whether the deadline fired (the phase may still have returned, late)."""
        return self._expired


def _json_copy(value: Any) -> Any:
    """A deep copy of JSON-shaped data (what a validated request holds), three times faster
    than `copy.deepcopy`; anything else is deep-copied as usual."""
    if isinstance(value, dict):
        return {key: _json_copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_copy(item) for item in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return copy.deepcopy(value)


def _failure_message(
    exc: Exception, deadline_fired: bool, phase: str, limit: float | None, queued_sec: float
) -> str:
    # User code may raise its own TimeoutError (an HTTP client giving up); only our deadline
    # gets the deadline message. Both are category `timeout`.
    if deadline_fired:
        return _deadline_message(phase, limit, queued_sec)
    return str(exc) or type(exc).__name__


def _log_failure(exc: Exception, deadline_fired: bool, what: str, message: str) -> None:
    if deadline_fired:
        logger.warning("%s: %s", what, message)  # our own deadline: the traceback says nothing
    else:
        logger.error("%s failed: %s", what, message, exc_info=exc)


def _deadline_message(phase: str, limit: float | None, queued_sec: float) -> str:
    message = f"{phase} exceeded its {limit}s deadline"
    if queued_sec >= 0.1:
        message += f" ({queued_sec:.1f}s of it spent queued)"
    return message


def _resolve(target: Any) -> Any:
    """A class or object as given, or the object an import string names."""
    if not isinstance(target, str):
        return target
    module_name, sep, attr = target.partition(":")
    if not sep:
        module_name, _, attr = target.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"cannot import {target!r}: use 'package.module:Name'")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj
