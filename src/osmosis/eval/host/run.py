"""Hosting the engine for `osmosis eval run` and the platform worker: a run directory, the
site the host asks for, a bridge.

    plan = plan_run(config_path, options)
    report = await run_evaluation(plan, reporter, site=SandboxSiteSpec())

Stages: open (or resume) the run directory → start the local model when asked → start the
bridge → sync the rollout environment (in a thread: Ctrl-C and `eval stop` are honoured while uv
works) → start `replicas` rollout servers on the site (`osmosis.eval.sites.spec.build_site`),
while the model's pre-flight probe runs alongside → dispatch what is pending once both are
ready → write index, metrics and progress. Every child process is stopped on the way out, also
on Ctrl-C; a SIGKILL of this process kills the rollout servers with it. What cannot start is a
typed `HostError` (see `osmosis.eval.errors`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from osmosis.eval.engine import DEFAULT_OUTAGE_WAIT_SEC, Engine, EngineOutcome, EngineSettings
from osmosis.eval.errors import HostError
from osmosis.eval.host import tracing
from osmosis.eval.host.attempt_keys import KeyedSite
from osmosis.eval.host.frozen_heap import frozen_heap
from osmosis.eval.host.observe import (
    BridgeHooks,
    ObservedSink,
    ObservedSite,
    Observers,
    RunObserver,
    observed_bridge,
)
from osmosis.eval.host.plan import RunOptions, RunPlan
from osmosis.eval.host.run_dir import RunDirectory, Slots, redact_record
from osmosis.eval.inputs.dataset import read_rows
from osmosis.eval.results.metrics import summarize
from osmosis.eval.results.records import AttemptRecord, WorkItem
from osmosis.eval.results.redact import Redactor, sensitive_env_values
from osmosis.eval.results.trial_outputs import DEFAULT_ARTIFACT_LIMITS
from osmosis.eval.sites import cpu_split
from osmosis.eval.sites.spawn import live_pids
from osmosis.eval.sites.spec import (
    LocalSiteSpec,
    RaySiteSpec,
    SandboxSiteSpec,
    SiteContext,
    SiteSpec,
    build_site,
)
from osmosis.vocabulary import LocalRunStatus

if TYPE_CHECKING:
    from osmosis.eval.model.bridge import Budget, ModelBridge, Spend
    from osmosis.eval.model.bridge_address import BridgeAddress
    from osmosis.eval.model.bridge_record import CallRecorder
    from osmosis.eval.sites.environment import RolloutEnvironment
    from osmosis.eval.sites.seam import Site

_T = TypeVar("_T")
# The longest the bridge's imports wait for the rollout server's spawn (`_policy`).
SPAWN_WAIT_SEC = 0.5
STOP_HALT = "stopped on request"
"""The halt reason of a run whose `stop` event was set (`run_evaluation`)."""


class Reporter(Protocol):
    """What the CLI shows while a run goes on."""

    def stage(self, message: str) -> None: ...

    def start_progress(self, total: int, done: int, *, pass_threshold: float) -> None: ...

    def advance(self, record: AttemptRecord) -> None: ...

    def log_line(self, line: str) -> None: ...


@dataclass
class RunReport:
    """The outcome of `eval run`, as the results table and the JSON envelope show it."""

    run_name: str
    local_run_id: str
    output_path: Path
    status: LocalRunStatus  # finished or incomplete: it is `running` only to a viewer
    total_work_items: int
    dispatched: int = 0
    resumed: int = 0
    halted: str | None = None
    interrupted: bool = False
    duration_ms: float = 0.0
    metrics: dict[str, Any] = field(default_factory=dict)
    failed_rows: list[dict[str, Any]] = field(default_factory=list)
    nothing_to_do: bool = False
    bridge: dict[str, Any] = field(default_factory=dict)
    """What the model bridge refused or answered late, over every invocation of the run
    (metrics.json `eval_run.bridge`): `refused_calls`, `late_calls`, `late_tokens`,
    `late_cost_usd`; and what every call that reached the provider spent, which the run's
    budget counts: `spent_calls`, `spent_tokens`, `spent_cost_usd`; the provider's 429 and
    overload answers, `throttled_calls`, and the bridge's `adaptive_limit` at the end."""


class RunFailed(HostError):
    """The run could not start (the model, its pre-flight, the bridge)."""


async def run_evaluation(
    plan: RunPlan,
    reporter: Reporter,
    *,
    site: SiteSpec | None = None,
    observer: RunObserver | None = None,
    stop: asyncio.Event | None = None,
) -> RunReport:
    """Run (or resume) the planned evaluation to completion or to a halt.

    `site`: where the rollout servers run (`osmosis.eval.sites.spec`): plain child
    processes, the bubblewrap sandbox or a Ray cluster. None: what the plan's options say
    (`default_site`).

        report = await run_evaluation(plan, reporter, site=SandboxSiteSpec())
        report.status  # 'finished'

    `observer`: told what the run does (`osmosis.eval.host.observe`: the platform worker's
    metrics); with OTEL_EXPORTER_OTLP_ENDPOINT set, the run's spans are told too (`tracing`).

    `stop`: once set, the run halts (`STOP_HALT`): nothing more is dispatched and what is in
    flight is cancelled and stays pending. A stop that holds even when the caller's
    cancellation of this coroutine does not reach the engine (the platform's `eval stop`).
    """
    spec = default_site(plan.options) if site is None else site
    observer = Observers.of(observer, tracing.from_env())
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
        redactor=redactor,
        artifact_limits=plan.options.artifact_limits or DEFAULT_ARTIFACT_LIMITS,
        official_trials=plan.options.official_trials,
    )
    with run:
        # Duration is active time: a resumed run adds this invocation to the earlier ones'
        # (their metrics.json), and its start stays the first one (manifest `created_at`).
        earlier_ms = _earlier_active_ms(plan.run_dir)
        earlier_bridge = _earlier_bridge(plan.run_dir)

        def active_ms() -> float:
            return round(earlier_ms + (time.monotonic() - started) * 1000, 3)

        # A resume may use another number of servers, or another sandbox.
        run.note_provenance(
            replicas=plan.options.replicas,
            sandbox=spec.policy.network if isinstance(spec, SandboxSiteSpec) else "off",
            executor=plan.options.executor,
        )
        for warning in plan.secrets.warnings:
            run.log(f"warning: {warning}")
            reporter.stage(f"warning: {warning}")
        run.write_progress(
            {
                "total_runs": plan.total_work_items,
                "sampled_rows": len(plan.selection),
                "total_dataset_rows": plan.selection.total_rows,
            }
        )
        pending = _count_pending(run, plan)
        report = RunReport(
            run_name=plan.name,
            local_run_id=str(run.manifest["local_run_id"]),
            output_path=plan.run_dir,
            status="finished",
            total_work_items=plan.total_work_items,
            resumed=plan.total_work_items - pending,
            bridge=earlier_bridge,
        )
        if observer is not None:
            observer.run_started(
                run_id=plan.name,
                local_run_id=report.local_run_id,
                pass_threshold=plan.config.evaluation.pass_threshold,
            )
        reporter.stage(f"{plan.name}: {pending} of {plan.total_work_items} work items pending")
        run.log(f"run {plan.name}: {pending} of {plan.total_work_items} work items pending")
        if pending == 0:
            report.nothing_to_do = True
        else:
            try:
                outcome = await _dispatch(
                    plan,
                    run,
                    redactor,
                    reporter,
                    pending,
                    bridge_token,
                    spec,
                    report,
                    observer,
                    stop,
                )
            except asyncio.CancelledError:
                # Ctrl-C: what finished is recorded; write the outputs for it, then stop.
                report.interrupted = True
                report.duration_ms = active_ms()
                _finish(plan, run, report)
                run.log("interrupted; run again with the same --name to resume")
                if observer is not None:
                    observer.run_ended(status="interrupted", halted=None)
                raise
            except BaseException:
                if observer is not None:
                    observer.run_ended(status="failed", halted=None)
                raise
            report.dispatched = outcome.dispatched
            report.halted = outcome.halted
            report.interrupted = outcome.interrupted
        report.duration_ms = active_ms()
        _finish(plan, run, report)
        if observer is not None:
            observer.run_ended(status=report.status, halted=report.halted)
    return report


async def _dispatch(
    plan: RunPlan,
    run: RunDirectory,
    redactor: Redactor,
    reporter: Reporter,
    pending: int,
    bridge_token: str,
    spec: SiteSpec,
    report: RunReport,
    observer: RunObserver | None = None,
    stop: asyncio.Event | None = None,
) -> EngineOutcome:
    # Imported here: each pulls in a server stack the planning half never needs.
    from osmosis.eval.sites.environment import prepare_environment_async

    evaluation = plan.config.evaluation
    log = _tee(run, reporter)
    cache_root = plan.options.env_cache or plan.workspace / ".osmosis" / "envs"
    if plan.options.executor == "ray" and isinstance(spec, SandboxSiteSpec):
        raise RunFailed(
            "the rollout sandbox runs rollout servers on this machine; it does not apply to "
            "the Ray executor",
            hint="drop --sandbox, or run with the local executor",
        )
    # A sandboxed run builds its environment in the sandbox too: the build runs the rollout's
    # own code (its build backend). On Ray each node prepares the environment itself.
    build_sandbox = None
    if isinstance(spec, SandboxSiteSpec):
        from osmosis.eval.sites.sandbox.build import BuildSandbox  # socketserver, its proxy

        build_sandbox = await asyncio.to_thread(BuildSandbox.for_policy, spec.policy)
    replicas = plan.options.replicas
    servers = (
        "one rollout server per Ray node"
        if replicas is None
        else "rollout server"
        if replicas == 1
        else f"{replicas} rollout servers"
    )
    async with contextlib.AsyncExitStack() as stack:
        if not isinstance(spec, RaySiteSpec):
            # The dispatch's event loop and this machine's servers on CPUs of their own.
            split = cpu_split.reserve()
            stack.callback(cpu_split.release)
            if split is not None:
                run.log(split.describe())
        # The bridge's address is taken first, so the rollout servers (told it) start while
        # the bridge sets up its transport and price, or a local model loads; and the model's
        # pre-flight runs while they start. None needs another, each costs a few hundred ms
        # of a short run (seconds for a local model). A pre-flight failure cancels the start
        # and is the run's error; nothing is dispatched before both are done.
        address = _bridge_address(plan, spec)
        stack.callback(address.close)  # a no-op once the bridge has started on it
        started: list[Site] = []
        # Set once a rollout server's process runs (or its start is over, or it starts on
        # Ray's nodes): the bridge's imports wait for it, not to slow the spawn down.
        spawned = asyncio.Event()

        async def start_servers() -> Site:
            try:
                environment = (
                    None
                    if isinstance(spec, RaySiteSpec)
                    else await prepare_environment_async(
                        plan.rollout_dir,
                        cache_root=cache_root,
                        log=log,
                        scope=_env_scope(plan),
                        checkout=plan.workspace,
                        sandbox=build_sandbox,
                    )
                )
                log(f"starting {servers} ({plan.config.experiment.entrypoint})")
                context = _site_context(
                    plan, spec, environment, address, run, reporter, redactor, spawned.set
                )
                site = build_site(spec, context)
                started.append(site)  # stopped on the way out, also when starting fails
                if isinstance(spec, RaySiteSpec):
                    spawned.set()  # its servers start in the cluster's processes
                await site.start(replicas)
                return site
            finally:
                spawned.set()

        async def stop_servers() -> None:
            while started:
                await started.pop().stop()

        starting = asyncio.create_task(start_servers())
        stack.push_async_callback(stop_servers)  # when the bridge could not start
        stack.push_async_callback(_cancelled, starting)
        bridge, checking = await stack.enter_async_context(
            _policy(
                plan,
                redactor,
                log,
                bridge_token,
                report.bridge,
                address,
                spawned,
                observer,
            )
        )
        # Stopped before the bridge is: a draining rollout still reaches the model.
        stack.push_async_callback(stop_servers)
        stack.push_async_callback(_cancelled, starting)
        stack.push_async_callback(_cancelled, checking)
        site = await _unless_failed(checking, starting)
        await checking
        endpoints = site.endpoints
        replicas = len(endpoints)
        run.note_provenance(replicas=replicas)  # Ray's default is only known now
        servers = "rollout server" if replicas == 1 else f"{replicas} rollout servers"
        for endpoint in endpoints:
            run.log(f"rollout server {endpoint.name} healthy at {endpoint.base_url}")
        reporter.stage(f"{servers} healthy: {', '.join(e.base_url for e in endpoints)}")
        capacities = [endpoint.capacity for endpoint in endpoints]
        capacity = sum(c for c in capacities if c) if all(capacities) else None
        wanted = plan.options.max_in_flight or evaluation.batch_size or capacity or replicas
        concurrency = min(wanted, capacity) if capacity else wanted
        if concurrency < wanted:
            # Said, not silent: more would only wait in the servers' queues, where each
            # attempt's agent deadline already runs (it counts from submission).
            asked = "--max-in-flight" if plan.options.max_in_flight else "batch_size"
            note = (
                f"{asked} {wanted} is above the rollout servers' capacity of {capacity} "
                f"(/health max_concurrent); running {concurrency} in flight"
            )
            reporter.stage(note)
            run.log(note)
        reporter.stage(f"running {pending} work items, up to {concurrency} in flight")
        run.log(f"dispatching {pending} work items with concurrency {concurrency}")
        reporter.start_progress(
            plan.total_work_items,
            plan.total_work_items - pending,
            pass_threshold=evaluation.pass_threshold,
        )
        recorder = bridge.recorder
        # Each admitted rollout tells the call record its attempt (row, run index).
        keyed = KeyedSite(site, recorder.assign) if recorder is not None else site
        engine = Engine(
            site=keyed if observer is None else ObservedSite(keyed, observer),
            bridge=bridge if observer is None else observed_bridge(bridge, observer),
            sink=run if observer is None else ObservedSink(run, observer),
            settings=EngineSettings(
                concurrency=concurrency,
                agent_timeout_sec=evaluation.agent_workflow_timeout_s,
                grader_timeout_sec=evaluation.grader_timeout_s,
                outage_wait_sec=plan.options.outage_wait_s or DEFAULT_OUTAGE_WAIT_SEC,
                verdict_wait_sec=_verdict_wait(plan.options.stall_after_s),
            ),
            # What the reporter (the platform's database) sees is redacted as the journal is.
            on_record=lambda record: reporter.advance(redact_record(record, redactor.redact)),
        )
        if bridge.budget_exhausted.is_set():  # spent by earlier invocations: dispatch nothing
            engine.halt(bridge.budget_reason or "budget: spent")
        if stop is not None and stop.is_set():  # stopped while starting: dispatch nothing
            engine.halt(STOP_HALT)
        watches = [asyncio.create_task(_halt_on_budget(bridge, engine))]
        if stop is not None:
            watches.append(asyncio.create_task(_halt_on_stop(stop, engine)))
        try:
            with frozen_heap(), cpu_split.loop_on_its_cpu(servers=live_pids()):
                return await engine.run(_work_items(plan, run))
        finally:
            for watch in watches:
                await _cancelled(watch)
            _note_bridge(bridge, run, report)
            if recorder is not None and recorder.mode != "off":
                # Also in metrics.json `eval_run.bridge`, over every invocation of the run:
                # `eval info` and the platform's detail view show them.
                totals = report.bridge
                totals["cache_mode"] = recorder.mode
                totals["cache_hits"] = int(totals.get("cache_hits", 0)) + recorder.hits
                totals["cache_misses"] = int(totals.get("cache_misses", 0)) + recorder.misses
                run.log(
                    f"cache {recorder.mode}: {recorder.hits} model calls answered from the "
                    f"record, {recorder.misses} not in it"
                )
    raise AssertionError("unreachable")  # pragma: no cover - the stack re-raises


def _bridge_address(plan: RunPlan, spec: SiteSpec) -> BridgeAddress:
    """The model bridge's listening socket, bound now (`BridgeAddress`); for a sandbox, the
    one a spare server this process holds forwards to (`sites.sandbox.spare`), if it fits."""
    from osmosis.eval.model.bridge_address import BridgeAddress

    host = plan.options.bridge_host
    if isinstance(spec, SandboxSiteSpec):
        from osmosis.eval.sites.sandbox import spare

        held = spare.take_bridge(host, plan.options.bridge_url)
        if held is not None:
            return held
    try:
        return BridgeAddress.listen(host, advertise_url=plan.options.bridge_url)
    except OSError as error:
        raise RunFailed(
            f"the model bridge cannot listen on {host}: {error}",
            hint="choose another --bridge-host (or OSMOSIS_BRIDGE_HOST)",
        ) from None


async def _unless_failed(check: asyncio.Task[None], work: Awaitable[_T]) -> _T:
    """`work`'s result, unless `check` fails first: then `work` is cancelled and `check`'s
    error raised (a broken model says more than what starting was cut short by it)."""
    doing = asyncio.ensure_future(work)
    try:
        await asyncio.wait({check, doing}, return_when=asyncio.FIRST_COMPLETED)
        if check.done() and not check.cancelled() and check.exception() is not None:
            await _cancelled(doing)
            check.result()  # raises
        return await doing
    finally:
        await _cancelled(doing)


async def _cancelled(task: asyncio.Future[Any]) -> None:
    """Cancel `task` if it still runs and wait until it has stopped."""
    if not task.done():
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


async def _halt_on_budget(bridge: ModelBridge, engine: Engine) -> None:
    """Halt the run once the bridge held a call because the budget is spent: the attempts in
    flight are cancelled and stay pending, so a resume with a raised budget runs them."""
    if not bridge.budget_exhausted.is_set():
        await bridge.budget_exhausted.wait()
    engine.halt(bridge.budget_reason or "budget: spent")


async def _halt_on_stop(stop: asyncio.Event, engine: Engine) -> None:
    """Halt the run once `stop` is set (also when it was before dispatch began)."""
    await stop.wait()
    engine.halt(STOP_HALT)


def _import_policy_modules() -> None:
    import osmosis.eval.model.bridge
    import osmosis.eval.model.local_model
    import osmosis.eval.model.preflight
    import osmosis.eval.model.pricing
    import osmosis.eval.model.providers  # noqa: F401


@contextlib.asynccontextmanager
async def _policy(
    plan: RunPlan,
    redactor: Redactor,
    log: Callable[[str], None],
    token: str,
    earlier: dict[str, Any],
    address: BridgeAddress,
    spawned: asyncio.Event,
    observer: RunObserver | None = None,
) -> AsyncIterator[tuple[ModelBridge, asyncio.Task[None]]]:
    """The bridge to the run's model (starting the local model first when asked), started,
    and the model's pre-flight probe, which must pass before anything is dispatched (a
    `RunFailed` when it does not): a task already running, alongside the bridge's start and
    the rollout servers'.
    `earlier`: the bridge's figures from the run's earlier invocations (what they spent);
    `spawned`: set once the rollout servers' spawn no longer needs this process's CPU."""
    # Its modules (~0.1 s of CPU) are imported off the event loop, once the rollout server
    # runs: it then boots on the other core meanwhile. Before, the import thread took the GIL
    # from the site's start (a sandbox's takes ~50 ms of this process first). Not later than
    # SPAWN_WAIT_SEC: while an environment builds, the pre-flight still runs alongside.
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(spawned.wait(), SPAWN_WAIT_SEC)
    await asyncio.to_thread(_import_policy_modules)
    from osmosis.eval.model.bridge import (
        DEFAULT_MAX_REQUEST_BYTES,
        DEFAULT_MAX_TOKENS,
        ModelBridge,
        OutagePolicy,
    )
    from osmosis.eval.model.local_model import LocalModelError, LocalModelServer, is_local_model
    from osmosis.eval.model.preflight import ModelPreflightError, preflight
    from osmosis.eval.model.pricing import Price
    from osmosis.eval.model.providers import ModelResolutionError, ModelTarget, resolve_model

    spent = _earlier_spend(earlier)
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
        recorder = _recorder(plan, redactor)

        async def check_model() -> None:
            if recorder.mode == "replay":  # a replay never calls the model: it may be down
                return
            log(f"checking model {model_path}")
            try:
                result = await preflight(target, redact=redactor.redact)
            except ModelPreflightError as error:
                raise RunFailed(
                    f"model pre-flight failed for {model_path}: {redactor.redact(str(error))}",
                    code="VALIDATION",
                    hint="nothing was dispatched; fix the model settings and run again",
                ) from None
            log(f"model {model_path} answered the pre-flight in {result.latency_ms:.0f} ms")

        # Sent now rather than once the bridge listens: the probe needs only the model, and
        # at a provider's latency (hundreds of ms) it is what the first dispatch waits for.
        checking = asyncio.create_task(check_model())
        stack.push_async_callback(_cancelled, checking)
        stall = plan.options.stall_after_s
        evaluation = plan.config.evaluation
        budget = plan.budget
        price = (
            Price(
                input_per_token=evaluation.input_usd_per_mtok / 1e6,
                output_per_token=evaluation.output_usd_per_mtok / 1e6,
            )
            if evaluation.input_usd_per_mtok is not None
            and evaluation.output_usd_per_mtok is not None
            else None
        )
        bridge = ModelBridge(
            target=target,
            token=token,
            redact=redactor.redact,
            advertise_url=plan.options.bridge_url,
            max_tokens=plan.options.bridge_max_tokens or DEFAULT_MAX_TOKENS,
            max_request_bytes=plan.options.bridge_max_request_bytes or DEFAULT_MAX_REQUEST_BYTES,
            # A shorter stall window probes sooner and waits less for each probe's answer.
            outage_policy=OutagePolicy(
                stall_after_s=stall,
                probe_timeout_s=min(10.0, stall),
                probe_first_s=min(1.0, stall / 2),
                probe_max_s=min(30.0, max(1.0, 5 * stall)),
            )
            if stall is not None
            else OutagePolicy(),
            budget=budget,
            spent_before=spent,
            price=price,
            recorder=recorder,
            max_in_flight=plan.options.max_in_flight or evaluation.batch_size,
        )
        if observer is not None:
            bridge.observer = BridgeHooks(observer)  # before start: it wraps the transport
        await bridge.start(address=address)
        stack.push_async_callback(bridge.stop)
        if budget.max_cost_usd is not None and bridge.price is None:
            raise RunFailed(
                f"max_cost_usd needs a price for {model_path}, and LiteLLM's price table lists "
                "none: set input_usd_per_mtok and output_usd_per_mtok in [evaluation]",
                code="VALIDATION",
                hint="nothing was dispatched",
            )
        if budget.limited:
            log(f"budget: {_describe_budget(budget, spent)}")
        yield bridge, checking


def _recorder(plan: RunPlan, redactor: Redactor) -> CallRecorder:
    """The run's record of model calls (`model_calls.jsonl`), with the answers it may give."""
    from osmosis.eval.model.bridge_record import RECORD_FILE, CallRecorder, RecordError

    try:
        return CallRecorder(
            plan.run_dir / RECORD_FILE,
            mode=plan.cache_mode,
            sources=plan.record_sources,
            redactor=redactor,
            model=plan.config.experiment.model_path,
        )
    except RecordError as error:
        raise RunFailed(str(error), hint="nothing was dispatched") from None


def _note_bridge(bridge: ModelBridge, run: RunDirectory, report: RunReport) -> None:
    """Add what the bridge refused or answered late to the run's totals, and say so in the
    run log: calls under rollout ids the run did not dispatch never reach the provider."""
    stats = bridge.stats()
    totals = report.bridge
    for name in ("refused_calls", "late_calls", "late_tokens"):
        totals[name] = int(totals.get(name, 0)) + getattr(stats, name)
    if stats.late_cost_usd is not None:
        totals["late_cost_usd"] = float(totals.get("late_cost_usd") or 0.0) + stats.late_cost_usd
    else:
        totals.setdefault("late_cost_usd", None)
    spent = bridge.spent()
    for name, value in (("spent_calls", spent.calls), ("spent_tokens", spent.tokens)):
        totals[name] = int(totals.get(name, 0)) + value
    totals["spent_cost_usd"] = float(totals.get("spent_cost_usd") or 0.0) + spent.cost_usd
    # 429 / overloaded answers, and the adaptive limit on calls in flight as the run ended.
    totals["throttled_calls"] = int(totals.get("throttled_calls", 0)) + stats.throttled_calls
    totals["adaptive_limit"] = stats.limit
    if stats.throttled_calls:
        run.log(
            f"model bridge: the provider answered {stats.throttled_calls} calls 429 or "
            f"overloaded (retried); adaptive limit {stats.limit} calls in flight"
        )
    if stats.refused_calls:
        run.log(
            f"model bridge: refused {stats.refused_calls} calls under rollout ids this run did "
            "not dispatch, or whose attempt had finished (403; none reached the provider)"
        )
    if stats.late_calls:
        run.log(
            f"model bridge: {stats.late_calls} calls were answered after their attempt "
            f"finished: {stats.late_tokens} tokens not in any attempt's record"
        )


def default_site(options: RunOptions) -> SiteSpec:
    """The site `eval run`'s options ask for when the host names none: the Ray cluster with
    `--executor ray`, else plain child processes of this one.

    default_site(RunOptions(executor="ray"))  # RaySiteSpec(address=None, ...)
    """
    if options.executor == "ray":
        return RaySiteSpec(address=options.ray_address, max_replicas=options.max_replicas)
    return LocalSiteSpec()


def _env_scope(plan: RunPlan) -> str:
    """Whose venvs these are (the workspace): a venv is never shared across scopes."""
    return plan.options.env_scope or f"path:{plan.workspace.resolve()}"


def _site_context(
    plan: RunPlan,
    spec: SiteSpec,
    environment: RolloutEnvironment | None,
    bridge: BridgeAddress,
    run: RunDirectory,
    reporter: Reporter,
    redactor: Redactor,
    on_spawned: Callable[[], None],
) -> SiteContext:
    """What the site needs of this run; refuses a sandbox the bridge cannot be reached from."""
    if isinstance(spec, SandboxSiteSpec):
        from urllib.parse import urlsplit

        from osmosis.loopback import is_loopback

        if not is_loopback(urlsplit(bridge.base_url).hostname or ""):
            raise RunFailed(
                f"a sandboxed rollout reaches the model bridge on its own loopback only, not "
                f"at {bridge.base_url}",
                hint="leave --bridge-url / OSMOSIS_BRIDGE_URL unset for sandboxed runs",
            )
    return SiteContext(
        workspace=plan.workspace,
        rollout_dir=plan.rollout_dir,
        entrypoint=plan.config.experiment.entrypoint,
        env={**plan.config.env, **plan.secrets.values},
        trials_root=plan.run_dir / "rollout_trials",
        log=_rollout_log(run, reporter),
        redactor=redactor,
        artifact_limits=plan.options.artifact_limits or DEFAULT_ARTIFACT_LIMITS,
        bridge_url=bridge.base_url,
        env_scope=_env_scope(plan),
        bridge_bound_url=bridge.bound_url,
        environment=environment,
        on_spawned=on_spawned,
    )


def _work_items(plan: RunPlan, run: RunDirectory) -> Iterator[WorkItem]:
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


def _is_pending(run: RunDirectory, plan: RunPlan, row_index: int, run_index: int) -> bool:
    status = run.status_of(row_index, run_index)
    if status is None:
        return True
    return plan.options.retry_failed and status in ("failed", "skipped")


def _count_pending(run: RunDirectory, plan: RunPlan) -> int:
    return sum(
        1
        for row_index in range(len(plan.selection))
        for run_index in range(plan.n)
        if _is_pending(run, plan, row_index, run_index)
    )


def _finish(plan: RunPlan, run: RunDirectory, report: RunReport) -> None:
    """Recompute everything from the journal and write the output files."""
    evaluation = plan.config.evaluation
    failed: list[AttemptRecord] = []

    with run.indexing() as index:

        def noting_failures(records: Iterable[AttemptRecord]) -> Iterator[AttemptRecord]:
            # One pass over the journal feeds the metrics, writes index.jsonl and collects
            # the failed rows: each journal line is parsed once, not twice (500 records:
            # 64 ms instead of 84).
            for record in records:
                index(record)
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
            "replicas": run.manifest.get("provenance", {}).get("replicas", plan.options.replicas),
            "duration_ms": report.duration_ms,
            "started_at": run.manifest.get("created_at"),
            "completed_at": now if complete else None,
            "bridge": report.bridge or {"refused_calls": 0, "late_calls": 0, "late_tokens": 0},
            "halted": report.halted,
        },
        indexed=True,
    )
    if report.halted:
        run.log(f"run incomplete: {report.halted}")


def _earlier_active_ms(run_dir: Path) -> float:
    """The active time of this run's earlier invocations, as their metrics.json says."""
    try:
        value = json.loads((run_dir / "metrics.json").read_text())["eval_run"]["duration_ms"]
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0
    return float(value) if isinstance(value, (int, float)) and value > 0 else 0.0


def _earlier_bridge(run_dir: Path) -> dict[str, Any]:
    """What the bridge refused or answered late in this run's earlier invocations."""
    try:
        value = json.loads((run_dir / "metrics.json").read_text())["eval_run"]["bridge"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return dict(value) if isinstance(value, dict) else {}


def _earlier_spend(bridge: dict[str, Any]) -> Spend:
    """What the run's earlier invocations spent at the provider (their metrics.json)."""
    from osmosis.eval.model.bridge import Spend

    def number(name: str) -> float:
        value = bridge.get(name)
        return value if isinstance(value, (int, float)) and value > 0 else 0

    return Spend(
        calls=int(number("spent_calls")),
        tokens=int(number("spent_tokens")),
        cost_usd=float(number("spent_cost_usd")),
    )


def _describe_budget(budget: Budget, spent: Spend) -> str:
    return (
        f"{budget.describe()}; spent before this invocation: {spent.tokens:,} tokens, "
        f"{spent.calls:,} calls, ${spent.cost_usd:.6f}"
    )


def _redactor(plan: RunPlan, bridge_token: str) -> Redactor:
    """Secret values, the bridge token, and env values that look like credentials."""
    environ = {**plan.options.environ, **plan.config.env}
    values = [*plan.secrets.values.values(), *sensitive_env_values(environ), bridge_token]
    return Redactor(values)


def _verdict_wait(stall_after_s: float | None) -> float:
    """How long a failed attempt whose model call still hangs waits for the bridge's verdict:
    longer than the bridge needs to declare a stall (its silence window plus a probe)."""
    from osmosis.eval.model.bridge import OutagePolicy

    default = OutagePolicy()
    stall = default.stall_after_s if stall_after_s is None else stall_after_s
    return max(120.0, stall + default.probe_timeout_s + 30.0)


def _model_threads() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) - 1)


def _rollout_log(run: RunDirectory, reporter: Reporter) -> Callable[[str], None]:
    from osmosis.rollout.access_log import is_protocol_access_line

    def log(line: str) -> None:
        # uvicorn's access lines for the protocol's polling would bury the rollout's own
        # output in logs.txt (osmosis-ai rollouts print them; ours filter them already).
        if is_protocol_access_line(line):
            return
        run.log(line)
        reporter.log_line(line)  # shown with --verbose only

    return log


def _tee(run: RunDirectory, reporter: Reporter) -> Callable[[str], None]:
    def log(line: str) -> None:
        run.log(line)
        reporter.stage(line)

    return log


__all__ = ["STOP_HALT", "Reporter", "RunFailed", "RunReport", "default_site", "run_evaluation"]
