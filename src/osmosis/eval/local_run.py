"""Hosting the engine for `osmosis eval run`: a run directory, a rollout process, a bridge.

    plan = plan_local_run(config_path, options)
    report = await run_local(plan, reporter)

Stages: open (or resume) the run directory → sync the rollout environment → start the local
model when asked → start the bridge and check the model → start the rollout server → dispatch
what is pending → write index, metrics and progress. Every child process is stopped on the
way out, also on Ctrl-C; a SIGKILL of this process kills the rollout server with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from osmosis.eval.dataset import read_rows
from osmosis.eval.engine import Engine, EngineOutcome, EngineSettings, WorkItem
from osmosis.eval.local_plan import LocalRunPlan
from osmosis.eval.metrics import summarize
from osmosis.eval.records import AttemptRecord
from osmosis.eval.redact import Redactor, sensitive_env_values
from osmosis.eval.rollout_client import RolloutClient
from osmosis.eval.run_dir import RunDirectory, Slots


class Reporter(Protocol):
    """What the CLI shows while a run goes on."""

    def stage(self, message: str) -> None: ...

    def start_progress(self, total: int, done: int, *, pass_threshold: float) -> None: ...

    def advance(self, record: AttemptRecord) -> None: ...

    def log_line(self, line: str) -> None: ...


@dataclass
class LocalRunReport:
    """The outcome of `eval run`, as the results table and the JSON envelope show it."""

    run_name: str
    local_run_id: str
    output_path: Path
    status: str  # finished | incomplete
    total_work_items: int
    dispatched: int = 0
    resumed: int = 0
    halted: str | None = None
    interrupted: bool = False
    duration_ms: float = 0.0
    metrics: dict[str, Any] = field(default_factory=dict)
    failed_rows: list[dict[str, Any]] = field(default_factory=list)
    nothing_to_do: bool = False


class RunFailed(Exception):
    """The run could not start (environment, model pre-flight, rollout server start-up)."""

    def __init__(self, message: str, *, code: str = "VALIDATION", hint: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.hint = hint


async def run_local(plan: LocalRunPlan, reporter: Reporter) -> LocalRunReport:
    """Run (or resume) the planned evaluation to completion or to a halt."""
    started = time.monotonic()
    bridge_token = secrets.token_hex(16)  # made here so the redactor knows it from the start
    redactor = _redactor(plan, bridge_token)
    slots = Slots(rows=len(plan.selection), n=plan.n)
    run = RunDirectory.open(
        plan.run_dir,
        slots=slots,
        inputs=plan.inputs(),
        provenance=plan.provenance(),
        fresh=plan.options.fresh,
        redact=redactor.redact,
    )
    with run:
        run.write_progress(
            {
                "total_runs": plan.total_work_items,
                "sampled_rows": len(plan.selection),
                "total_dataset_rows": plan.selection.total_rows,
            }
        )
        pending = _count_pending(run, plan)
        report = LocalRunReport(
            run_name=plan.name,
            local_run_id=str(run.manifest["local_run_id"]),
            output_path=plan.run_dir,
            status="finished",
            total_work_items=plan.total_work_items,
            resumed=plan.total_work_items - pending,
        )
        reporter.stage(f"{plan.name}: {pending} of {plan.total_work_items} work items pending")
        run.log(f"run {plan.name}: {pending} of {plan.total_work_items} work items pending")
        if pending == 0:
            report.nothing_to_do = True
        else:
            try:
                outcome = await _dispatch(plan, run, redactor, reporter, pending, bridge_token)
            except asyncio.CancelledError:
                # Ctrl-C: what finished is recorded; write the outputs for it, then stop.
                report.interrupted = True
                report.duration_ms = round((time.monotonic() - started) * 1000, 3)
                _finish(plan, run, report)
                run.log("interrupted; run again with the same --name to resume")
                raise
            report.dispatched = outcome.dispatched
            report.halted = outcome.halted
            report.interrupted = outcome.interrupted
        report.duration_ms = round((time.monotonic() - started) * 1000, 3)
        _finish(plan, run, report)
    return report


async def _dispatch(
    plan: LocalRunPlan,
    run: RunDirectory,
    redactor: Redactor,
    reporter: Reporter,
    pending: int,
    bridge_token: str,
) -> EngineOutcome:
    # Imported here: each pulls in a server stack the planning half never needs.
    from osmosis.eval.environment import prepare_environment
    from osmosis.eval.rollout_process import RolloutProcess

    evaluation = plan.config.evaluation
    artifact_root = plan.run_dir / "rollout_trials"
    log = _tee(run, reporter)
    cache_root = plan.options.env_cache or plan.workspace / ".osmosis" / "envs"
    environment = prepare_environment(plan.rollout_dir, cache_root=cache_root, log=log)
    async with contextlib.AsyncExitStack() as stack:
        bridge = await stack.enter_async_context(_policy(plan, redactor, log, bridge_token))
        reporter.stage(f"starting rollout server ({plan.config.experiment.entrypoint})")
        process = await RolloutProcess.start(
            environment,
            plan.rollout_dir,
            plan.entrypoint,
            env={**plan.config.env, **plan.secrets.values},
            artifact_root=artifact_root,
            log=_rollout_log(run, reporter),
            redactor=redactor,
        )
        stack.push_async_callback(process.stop)
        reporter.stage(f"rollout server healthy on port {process.port}")
        client = await stack.enter_async_context(RolloutClient(process.base_url))
        capacity = _capacity(await client.health())
        concurrency = plan.options.max_in_flight or evaluation.batch_size or capacity or 1
        if capacity:
            concurrency = min(concurrency, capacity)
        reporter.stage(f"running {pending} work items, up to {concurrency} in flight")
        run.log(f"dispatching {pending} work items with concurrency {concurrency}")
        reporter.start_progress(
            plan.total_work_items,
            plan.total_work_items - pending,
            pass_threshold=evaluation.pass_threshold,
        )
        engine = Engine(
            rollout=client,
            bridge=bridge,
            sink=run,
            settings=EngineSettings(
                concurrency=concurrency,
                agent_timeout_sec=evaluation.agent_workflow_timeout_s,
                grader_timeout_sec=evaluation.grader_timeout_s,
                artifact_root=artifact_root,
            ),
            halt_signals=[process.exit_signal],
            on_record=reporter.advance,
        )
        return await engine.run(_work_items(plan, run))
    raise AssertionError("unreachable")  # pragma: no cover - the stack re-raises


@contextlib.asynccontextmanager
async def _policy(
    plan: LocalRunPlan, redactor: Redactor, log: Callable[[str], None], token: str
) -> AsyncIterator[Any]:
    """The bridge to the run's model (starting the local model first when asked), checked by
    a pre-flight probe before anything is dispatched."""
    from osmosis.eval.bridge import ModelBridge
    from osmosis.eval.local_model import LocalModelError, LocalModelServer, is_local_model
    from osmosis.eval.model_preflight import ModelPreflightError, preflight
    from osmosis.eval.providers import ModelResolutionError, ModelTarget, resolve_model

    model_path = plan.config.experiment.model_path
    environ = {**plan.options.environ, **plan.config.env, **plan.secrets.values}
    async with contextlib.AsyncExitStack() as stack:
        try:
            if is_local_model(model_path):
                log(f"starting local model {model_path}")
                # llama.cpp threads spin-wait: leave a core to the engine and the rollout.
                server = LocalModelServer.for_model(model_path, n_threads=_model_threads())
                await stack.enter_async_context(server)
                target = ModelTarget(
                    kind="openai-compatible",
                    model=server.model,
                    api_base=server.base_url,
                    api_key=server.api_key,
                    model_path=model_path,
                )
            else:
                target = resolve_model(model_path, environ)
        except (LocalModelError, ModelResolutionError) as error:
            raise RunFailed(str(error), hint="nothing was dispatched") from None
        log(f"checking model {model_path}")
        try:
            await preflight(target, redact=redactor.redact)
        except ModelPreflightError as error:
            raise RunFailed(
                f"model pre-flight failed for {model_path}: {redactor.redact(str(error))}",
                code="VALIDATION",
                hint="nothing was dispatched; fix the model settings and run again",
            ) from None
        bridge = ModelBridge(target=target, token=token, redact=redactor.redact)
        await bridge.start()
        stack.push_async_callback(bridge.stop)
        yield bridge


def _work_items(plan: LocalRunPlan, run: RunDirectory) -> Iterator[WorkItem]:
    """Pending attempts, streamed from the dataset: memory follows concurrency, not rows."""
    for row in read_rows(plan.dataset.path, plan.selection):
        for run_index in range(plan.n):
            if _is_pending(run, plan, row.row_index, run_index):
                yield WorkItem(
                    row_index=row.row_index,
                    run_index=run_index,
                    source_row_index=row.source_row_index,
                    messages=row.messages,
                    label=row.label,
                    metadata=row.metadata,
                )


def _is_pending(run: RunDirectory, plan: LocalRunPlan, row_index: int, run_index: int) -> bool:
    status = run.status_of(row_index, run_index)
    if status is None:
        return True
    return plan.options.retry_failed and status in ("failed", "skipped")


def _count_pending(run: RunDirectory, plan: LocalRunPlan) -> int:
    return sum(
        1
        for row_index in range(len(plan.selection))
        for run_index in range(plan.n)
        if _is_pending(run, plan, row_index, run_index)
    )


def _finish(plan: LocalRunPlan, run: RunDirectory, report: LocalRunReport) -> None:
    """Recompute everything from the journal and write the output files."""
    evaluation = plan.config.evaluation
    failed: list[AttemptRecord] = []

    def noting_failures(records: Iterable[AttemptRecord]) -> Iterator[AttemptRecord]:
        # One pass over the journal feeds the metrics and collects the failed rows.
        for record in records:
            if record.status == "failed":
                failed.append(record)
            yield record

    summary = summarize(noting_failures(run.records()), evaluation.pass_threshold)
    complete = run.recorded_count() == plan.total_work_items
    report.status = "finished" if complete else "incomplete"
    report.metrics = summary
    report.failed_rows = [
        {
            "row_index": record.row_index,
            "source_row_index": record.source_row_index,
            "run_index": record.run_index,
            "rollout_id": record.rollout_id,
            "error_type": record.error_type,
            "rollout_dir": str(plan.run_dir / "rollout_trials" / record.rollout_id),
        }
        for record in failed
    ]
    now = datetime.now(UTC).isoformat(timespec="milliseconds")
    run.write_outputs(
        status=report.status,
        summary=summary,
        eval_run={
            "id": report.local_run_id,
            "name": plan.name,
            "dataset_name": plan.dataset.name,
            "model_name": plan.config.experiment.model_path,
            "rollout_name": plan.config.experiment.rollout,
            "duration_ms": report.duration_ms,
            "started_at": run.manifest.get("created_at"),
            "completed_at": now if complete else None,
        },
    )
    if report.halted:
        run.log(f"run incomplete: {report.halted}")


def _redactor(plan: LocalRunPlan, bridge_token: str) -> Redactor:
    """Secret values, the bridge token, and env values that look like credentials."""
    environ = {**plan.options.environ, **plan.config.env}
    values = [*plan.secrets.values.values(), *sensitive_env_values(environ), bridge_token]
    return Redactor(values)


def _model_threads() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) - 1)


def _capacity(health: dict[str, object]) -> int | None:
    concurrency = health.get("concurrency")
    if isinstance(concurrency, dict):
        value = concurrency.get("max_concurrent")
        if isinstance(value, int) and value > 0:
            return value
    value = health.get("max_queue_depth")
    return value if isinstance(value, int) and value > 0 else None


def _rollout_log(run: RunDirectory, reporter: Reporter) -> Callable[[str], None]:
    def log(line: str) -> None:
        run.log(line)
        reporter.log_line(line)  # shown with --verbose only

    return log


def _tee(run: RunDirectory, reporter: Reporter) -> Callable[[str], None]:
    def log(line: str) -> None:
        run.log(line)
        reporter.stage(line)

    return log


__all__ = ["LocalRunReport", "Reporter", "RunFailed", "run_local"]
