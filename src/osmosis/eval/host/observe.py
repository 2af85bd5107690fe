"""Watching a run from the host (issue 29): the platform worker's Prometheus figures and the
OpenTelemetry spans both hear the same events, told by thin wrappers around what the engine
is given, so the engine itself knows nothing of them.

    observer = Observers.of(figures, tracing.from_env())   # None when nobody watches
    engine = Engine(site=ObservedSite(site, observer), bridge=ObservedBridge(bridge, observer),
                    sink=ObservedSink(run, observer), ...)
    bridge.observer = BridgeHooks(observer)                # provider requests, model calls

An attempt's life as told: `attempt_opened` (dispatched: the bridge opens its rollout id) →
`admitted` (the rollout server took it, or refused) → `model_call`s → `result_in` (its
terminal result; the bridge closes its id) → `recorded` (its record is durable) →
`attempt_closed` (the engine is done with the id, recorded or going back to pending).
Every method is cheap and synchronous, and a fault in an observer is logged, never raised
into the run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from osmosis.eval.results.records import AttemptRecord, FinishedAttempt
from osmosis.eval.sites.api import Lease, ResourceLimitBreach, RolloutAPI
from osmosis.eval.sites.seam import Endpoint, Site
from osmosis.eval.sites.wrapped import ApiWrappedSite, ForwardingAPI
from osmosis.rollout.protocol import RolloutInitRequest

if TYPE_CHECKING:
    from osmosis.eval.engine import PolicyBridge, ResultsSink
    from osmosis.eval.model.bridge_calls import CallRecord
    from osmosis.eval.model.providers import Completion, Transport

logger = logging.getLogger("osmosis.eval.host.observe")


class RunObserver:
    """Hears what a run does; every method does nothing here (subclasses pick theirs)."""

    def run_started(self, *, run_id: str, local_run_id: str, pass_threshold: float) -> None:
        """`run_id`: the run's name (the platform's run id); `local_run_id`: its manifest's."""

    def run_ended(self, *, status: str, halted: str | None) -> None:
        """`status`: finished, incomplete or interrupted."""

    def attempt_opened(self, rollout_id: str) -> None: ...

    def admitted(
        self,
        rollout_id: str,
        *,
        row: int | None,
        run: int | None,
        started_ns: int,
        ended_ns: int,
        error: str | None,
    ) -> None:
        """The admission request to the rollout server, from `started_ns` to `ended_ns`
        (`time.time_ns()`); `error`: why it did not admit the rollout, None when it did."""

    def model_call(self, call: CallRecord) -> None: ...

    def provider_answered(self, status: int | None, seconds: float) -> None:
        """One request to the provider: 200, its error status, or None (no answer)."""

    def result_in(self, rollout_id: str) -> None: ...

    def recorded(self, record: AttemptRecord) -> None: ...

    def attempt_closed(self, rollout_id: str) -> None: ...

    def server_restarted(self, name: str, reason: str, breach: ResourceLimitBreach | None) -> None:
        """A rollout server was replaced; `breach`: the resource limit that killed it."""


class Observers(RunObserver):
    """Several observers heard as one; a failing one is logged and the others still hear."""

    def __init__(self, observers: Sequence[RunObserver]) -> None:
        self.observers = tuple(observers)

    @classmethod
    def of(cls, *observers: RunObserver | None) -> RunObserver | None:
        present = [observer for observer in observers if observer is not None]
        if not present:
            return None
        return present[0] if len(present) == 1 else cls(present)

    def _tell(self, method: str, *args: Any, **kwargs: Any) -> None:
        for observer in self.observers:
            try:
                getattr(observer, method)(*args, **kwargs)
            except Exception:  # watching must never break the run
                logger.exception("run observer %s failed in %s", type(observer).__name__, method)

    def run_started(self, *, run_id: str, local_run_id: str, pass_threshold: float) -> None:
        self._tell(
            "run_started", run_id=run_id, local_run_id=local_run_id, pass_threshold=pass_threshold
        )

    def run_ended(self, *, status: str, halted: str | None) -> None:
        self._tell("run_ended", status=status, halted=halted)

    def attempt_opened(self, rollout_id: str) -> None:
        self._tell("attempt_opened", rollout_id)

    def admitted(
        self,
        rollout_id: str,
        *,
        row: int | None,
        run: int | None,
        started_ns: int,
        ended_ns: int,
        error: str | None,
    ) -> None:
        self._tell(
            "admitted",
            rollout_id,
            row=row,
            run=run,
            started_ns=started_ns,
            ended_ns=ended_ns,
            error=error,
        )

    def model_call(self, call: CallRecord) -> None:
        self._tell("model_call", call)

    def provider_answered(self, status: int | None, seconds: float) -> None:
        self._tell("provider_answered", status, seconds)

    def result_in(self, rollout_id: str) -> None:
        self._tell("result_in", rollout_id)

    def recorded(self, record: AttemptRecord) -> None:
        self._tell("recorded", record)

    def attempt_closed(self, rollout_id: str) -> None:
        self._tell("attempt_closed", rollout_id)

    def server_restarted(self, name: str, reason: str, breach: ResourceLimitBreach | None) -> None:
        self._tell("server_restarted", name, reason, breach)


def safely(observer: RunObserver) -> RunObserver:
    """`observer` with its faults logged rather than raised (what the wrappers call)."""
    return observer if isinstance(observer, Observers) else Observers([observer])


# -- the bridge's side ------------------------------------------------------------------------
class BridgeHooks:
    """The bridge's observer (`bridge_observer.BridgeObserver`) telling a `RunObserver`."""

    def __init__(self, observer: RunObserver) -> None:
        self._observer = safely(observer)

    def wrap_transport(self, transport: Transport) -> Transport:
        return _TimedTransport(transport, self._observer)

    def model_call(self, call: CallRecord) -> None:
        self._observer.model_call(call)


class _TimedTransport:
    """Each provider request timed and its answer's status told (a 429 is a `ProviderError`
    with status 429, retried or not)."""

    def __init__(self, inner: Transport, observer: RunObserver) -> None:
        self._inner = inner
        self._observer = observer

    async def complete(self, body: Mapping[str, Any]) -> Completion:
        from osmosis.eval.model.providers import ProviderError

        started = time.perf_counter()
        try:
            completion = await self._inner.complete(body)
        except ProviderError as error:
            self._observer.provider_answered(error.status, time.perf_counter() - started)
            raise
        self._observer.provider_answered(200, time.perf_counter() - started)
        return completion

    async def aclose(self) -> None:
        await self._inner.aclose()


class ObservedBridge:
    """The bridge as the engine sees it (`PolicyBridge`): opening, closing and forgetting a
    rollout id tell the observer; every other member is the bridge's own (looked up on it,
    so the engine's protocol may grow without this falling behind). `observed_bridge` types it."""

    def __init__(self, bridge: PolicyBridge, observer: RunObserver) -> None:
        self._bridge = bridge
        self._observer = safely(observer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bridge, name)

    def open_rollout(self, rollout_id: str) -> str:
        self._observer.attempt_opened(rollout_id)
        return self._bridge.open_rollout(rollout_id)

    def close_rollout(self, rollout_id: str) -> None:
        self._bridge.close_rollout(rollout_id)
        self._observer.result_in(rollout_id)

    def forget(self, rollout_id: str) -> None:
        self._bridge.forget(rollout_id)
        self._observer.attempt_closed(rollout_id)


def observed_bridge(bridge: PolicyBridge, observer: RunObserver) -> PolicyBridge:
    return cast("PolicyBridge", ObservedBridge(bridge, observer))


class ObservedSink:
    """The run directory as the engine sees it: each stored record is told once durable."""

    def __init__(self, sink: ResultsSink, observer: RunObserver) -> None:
        self._sink = sink
        self._observer = safely(observer)

    async def store(self, attempt: FinishedAttempt) -> None:
        await self._sink.store(attempt)
        self._observer.recorded(attempt.record)

    def log(self, line: str) -> None:
        self._sink.log(line)


# -- the site's side --------------------------------------------------------------------------
class _ObservedAPI(ForwardingAPI):
    """An endpoint's rollout protocol; `start` (the admission) is timed and told."""

    def __init__(self, api: RolloutAPI, observer: RunObserver) -> None:
        super().__init__(api)
        self._observer = observer

    async def start(self, request: RolloutInitRequest) -> Lease:
        extra = request.extra_fields or {}
        row, run = extra.get("row_index"), extra.get("run_index")
        started = time.time_ns()
        error: str | None = "cancelled"
        try:
            lease = await self.inner.start(request)
            error = None
            return lease
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self._observer.admitted(
                request.rollout_id,
                row=row if isinstance(row, int) else None,
                run=run if isinstance(run, int) else None,
                started_ns=started,
                ended_ns=time.time_ns(),
                error=error,
            )


class ObservedSite(ApiWrappedSite):
    """`site` as the engine sees it: admissions timed, replacements (restarts) told."""

    def __init__(self, site: Site, observer: RunObserver) -> None:
        observer = safely(observer)

        def replaced(old: Endpoint, reason: str) -> None:
            observer.server_restarted(old.name, reason, old.breach)

        super().__init__(site, lambda api: _ObservedAPI(api, observer), replaced=replaced)


def call_bounds_ns(call: CallRecord) -> tuple[int, int]:
    """When a recorded model call began and ended, in `time.time_ns()` terms."""
    began = int(call.started_at.timestamp() * 1e9)
    return began, began + int(call.latency_ms * 1e6)


__all__ = [
    "BridgeHooks",
    "ObservedBridge",
    "ObservedSink",
    "ObservedSite",
    "Observers",
    "RunObserver",
    "call_bounds_ns",
    "observed_bridge",
    "safely",
]
