"""The one evaluation engine: dispatch every pending attempt over a site's endpoints and
record what each one did.

Hosts (`osmosis eval run`, the platform worker) give it a started site, a bridge, the work
and a results sink; nothing here knows which host or which site it runs under.

    engine = Engine(site=site, bridge=bridge, sink=run_dir, settings=settings)
    outcome = await engine.run(work_items)

Honesty rules (issue 11):

- Every attempt ends `success`, `failed` (with an error type) or `skipped`, or it stays
  *pending* — never a silent zero. A fault of the system rather than of the rollout goes back
  to pending with a fresh rollout id: an endpoint that died or stopped answering (its
  in-flight attempts are retried on the others and on its replacement), a 5xx admission, a
  model bridge that answered 502/503, a provider outage.
- A provider outage (declared by the bridge) pauses dispatch; attempts whose model call was
  stuck are cancelled and re-run **from the start** once the provider answers again (their
  agent deadline is not paused: a fresh attempt gets a fresh deadline). A failed attempt
  whose model call is still outstanding waits for the bridge's verdict before it counts; one
  whose provider answered nobody since that call was sent (a stall shorter than the bridge's
  stall window) goes back to pending (`bridge.stalled`), and so does one that timed out
  only because its calls waited in such a stall, answered once it ended (`stall_time`).
  Past `outage_wait_sec` the run halts, resumable.
- Every dispatched task is awaited and its result read; an unexpected exception halts the
  run naming the attempt. The outcome's counts come from those results.
- A halt stops dispatch at once and cancels what is in flight: all of it stays pending.
- The bridge serves an attempt's rollout id from its dispatch until its result is in
  (`open_rollout`, `close_rollout`): a model call under any other id is refused, so every
  call the provider answers is in some attempt's tokens and cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from osmosis.eval.results.classify import attempt_trajectory, classify
from osmosis.eval.results.records import AttemptRecord, FinishedAttempt, PolicyCall, WorkItem
from osmosis.eval.sites.api import (
    PROTOCOL_ERROR,
    RESOURCE_LIMIT,
    AdmissionRejected,
    AtCapacity,
    Lease,
    MalformedResponse,
    ResourceLimitBreach,
    ResultDeadlineExceeded,
    ResultWithBreach,
    RolloutServerUnavailable,
)
from osmosis.eval.sites.seam import Endpoint, Site
from osmosis.rollout.protocol import RolloutInitRequest, RolloutResultResponse
from osmosis.rollout.types import ErrorCategory, RolloutStatus

_ID_BATCH = 256  # rollout ids drawn from the OS at once (`Engine._rollout_id`)

SUPERVISOR_GRACE_SEC = 60.0
"""Beyond the agent and grader deadlines, how long the engine waits for a result."""

DEFAULT_OUTAGE_WAIT_SEC = 300.0
"""How long a declared provider outage may last before the run halts (resumable)."""

RAMP_ADMISSIONS = 8
"""While an endpoint fills its first `concurrency` slots (its ramp: at the start, on a
replacement, after a 429 or an outage), at most this many of its admissions await an answer
at once.
A rollout server handed dozens of admissions together admits them all before any of their
rollouts runs, so their model calls leave in one burst, and every later wave of the run comes
back as one burst too; paced, each rollout reaches its first model call before the next
admission lands, and the waves stay spread out (bench/engine.py (c), 512 in flight at 1 s:
dispatch 1.104-1.114x its ideal unpaced, 1.069-1.080x paced). Past the ramp no admission
waits: there the slots free one by one, and a limit would only cost throughput."""

RECORD_AFTER_SEC = 0.05
"""How long after an attempt's result its record is made (its result classified, its
trajectory built, both stored), while other attempts are in flight. Results come in waves (64
in flight on a provider's steady latency come back within a few tens of ms of each other), and
~0.1 ms of the event loop per record, made at once, delays the admissions and model calls of
the attempts that follow in the same wave; made together 50 ms later, they fall in the wait
for the next answers (as the call record's lines do, `bridge_record.KEEP_AFTER_SEC`). The
attempt gives its slot back first, and its record keeps the time it ended. With nothing else
in flight the records are made at once: a run's last attempt does not wait. bench/engine.py
(b), 10 alternated rounds, the span the scripted model saw (first call in to last answer out)
over its ideal: 1.137x at once, 1.114x after 50 ms."""

_HEALTH_PROBE_SEC = 5.0
_DEATH_NOTICE_SEC = 1.0  # a failed probe waits this long for the site to say why it died
_REMOTE_CANCEL_SEC = 5.0
_VERDICT_POLL_SEC = 0.05


class ResultsSink(Protocol):
    """Where finished attempts go. `store` returns once the attempt is durable (the run
    directory writes on a thread with group commit: the event loop never waits on a disk)."""

    async def store(self, attempt: FinishedAttempt) -> None: ...

    def log(self, line: str) -> None: ...


class PolicyBridge(Protocol):
    """What the engine needs of the model bridge (INTERFACES.md §2)."""

    @property
    def token(self) -> str: ...

    @property
    def outage(self) -> asyncio.Event: ...

    @property
    def outage_reason(self) -> str | None: ...

    def open_rollout(self, rollout_id: str) -> str:
        """Serve calls under `rollout_id` (just dispatched); returns its model URL."""
        ...

    def close_rollout(self, rollout_id: str) -> None:
        """Serve no more calls under `rollout_id` (its attempt is over)."""
        ...

    def take_calls(self, rollout_id: str) -> Sequence[PolicyCall]: ...

    def forget(self, rollout_id: str) -> None: ...

    def stuck_rollouts(self) -> set[str]: ...

    def rate_wait(self, rollout_id: str) -> tuple[float, bool]:
        """(seconds its calls waited on the provider's rate limit unserved; one waits now)."""
        ...

    async def stalled(self, rollout_id: str) -> bool:
        """Whether its outstanding call waits on a provider that answered nobody since."""
        ...

    def stall_time(self, rollout_id: str) -> float:
        """Seconds its calls waited inside provider stalls a probe confirmed."""
        ...

    async def wait_recovered(self, timeout: float) -> bool: ...  # noqa: ASYNC109 - §2


@dataclass(frozen=True)
class EngineSettings:
    """How to run: concurrency, deadlines and how long to wait out faults."""

    concurrency: int
    agent_timeout_sec: float | None
    grader_timeout_sec: float | None
    outage_wait_sec: float = DEFAULT_OUTAGE_WAIT_SEC
    """A provider outage lasting longer halts the run (resumable)."""
    verdict_wait_sec: float = 120.0
    """How long a failed attempt whose model call is still outstanding waits for the bridge
    to either get an answer or declare an outage (longer than the bridge's stall window)."""
    max_requeues: int = 5
    """An attempt sent back to pending more often than this (outages and 429s aside) halts
    the run: something keeps failing that is not the rollout's fault."""
    admission_wait_sec: float = 600.0
    """An endpoint that answers nothing but 429 for this long is treated as gone."""
    supervisor_grace_sec: float = SUPERVISOR_GRACE_SEC
    """Beyond the agent and grader deadlines, how long to wait for a result."""

    @property
    def supervisor_deadline_sec(self) -> float:
        if self.agent_timeout_sec is None or self.grader_timeout_sec is None:
            return 3600.0
        return self.agent_timeout_sec + self.grader_timeout_sec + self.supervisor_grace_sec


@dataclass(frozen=True)
class EngineOutcome:
    """How a dispatch ended. `halted` carries the reason when a system fault stopped it."""

    dispatched: int
    """Distinct work items taken from the input (a re-run after a requeue is not counted)."""
    recorded: int
    pending: int
    """dispatched - recorded: what a resume will run again."""
    requeued: int = 0
    """Attempts that went back to pending and were dispatched again."""
    halted: str | None = None
    interrupted: bool = False


@dataclass(eq=False)
class _Lane:
    """One endpoint and what the engine knows of it."""

    endpoint: Endpoint
    load: int = 0
    cool_until: float = 0.0
    busy_since: float | None = None  # first 429 since the last admission
    probing: bool = False
    retired: bool = False
    watcher: asyncio.Task[None] | None = None
    solo: bool = False  # running a suspect of a resource limit: nothing else goes here
    ramp: int = 0  # admissions still paced (RAMP_ADMISSIONS)
    admitting: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(RAMP_ADMISSIONS))

    def has_room(self, now: float) -> bool:
        capacity = self.endpoint.capacity
        return (
            not self.retired
            and not self.solo
            and self.cool_until <= now
            and (capacity is None or self.load < capacity)
        )


@dataclass(eq=False)
class _Running:
    item: WorkItem
    rollout_id: str
    lane: _Lane
    requeue: str | None = None  # why the engine stopped it to run it again
    counts: bool = True  # whether that requeue counts towards max_requeues
    recording: bool = False  # finished, being stored: never cancelled, never requeued
    recorded: bool = False
    released: bool = False  # its concurrency slot and endpoint share are free again
    breach: ResourceLimitBreach | None = None  # its endpoint's resource limit: fails with it
    solo: bool = False  # a suspect of a resource limit, run alone on its endpoint


@dataclass(frozen=True)
class _Requeue:
    reason: str
    counts: bool = True


class Engine:
    """Evaluates work items on a site's endpoints through one bridge."""

    def __init__(
        self,
        *,
        site: Site,
        bridge: PolicyBridge,
        sink: ResultsSink,
        settings: EngineSettings,
        on_record: Callable[[AttemptRecord], None] | None = None,
    ) -> None:
        self.site = site
        self.bridge = bridge
        self.sink = sink
        self.settings = settings
        self.on_record = on_record
        self._halt_reason: str | None = None
        self._stopping = False
        self._outage: str | None = None
        self._lanes: list[_Lane] = []
        self._running: dict[asyncio.Task[_Requeue | None], _Running] = {}
        self._in_flight = 0  # attempts of `_running` not yet finished (being stored: not)
        self._requeued: deque[WorkItem] = deque()
        self._requeue_counts: dict[tuple[int, int], int] = {}
        # Attempts in flight on an endpoint killed by a resource limit with others: each is
        # re-run alone, so a second kill names the one that causes it (issue 12).
        self._suspects: set[tuple[int, int]] = set()
        self._background: set[asyncio.Task[Any]] = set()
        self._wake = asyncio.Event()
        self._records_due: asyncio.Future[None] | None = None  # see RECORD_AFTER_SEC
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._replacing = 0
        self._last_loss = "no rollout endpoint was started"
        self._source: AsyncIterator[WorkItem] | None = None
        self._exhausted = False
        self._dispatched = self._recorded = self._requeues = 0
        # Rollout ids: 32 hex digits from the OS's random source, drawn 256 at a time. uuid4
        # asks the OS for every id, and each system call on the event loop hands the GIL to
        # the writer thread and waits to get it back (0.19 ms an attempt on average, profiled
        # at a load of 6 on 2 cores). Still unpredictable: a rollout that saw its own ids
        # cannot name another attempt's (its files, its model calls).
        self._ids: list[str] = []
        self.rate_requeues = 0
        """Attempts sent back to pending because their model calls waited on the provider's
        rate limit as their deadline passed (`_queued_too_long`)."""

    @property
    def halt_reason(self) -> str | None:
        return self._halt_reason

    def halt(self, reason: str) -> None:
        """Stop dispatching; what is in flight is cancelled and stays pending."""
        if self._stopping:
            return
        if self._halt_reason is None:
            self._halt_reason = reason
            self.sink.log(f"halting dispatch: {reason}")
        self._wake.set()

    # -- the dispatch loop ------------------------------------------------------------------
    async def run(self, items: Iterable[WorkItem] | AsyncIterator[WorkItem]) -> EngineOutcome:
        """Dispatch every item with at most `concurrency` in flight over the site's endpoints;
        returns when every item is recorded or the run halted."""
        self._source = _aiter(items)
        for endpoint in self.site.endpoints:
            self._add(endpoint)
        outage_watch = asyncio.create_task(self._watch_outage(), name="engine-outage-watch")
        try:
            await self._drive()
            await self._drain()
        except BaseException:  # interrupted (Ctrl-C, eval stop): record nothing more
            await self._drain(stopping=True)
            raise
        finally:
            outage_watch.cancel()
            for lane in self._lanes:
                if lane.watcher is not None:
                    lane.watcher.cancel()
            for task in self._background:
                task.cancel()
            await asyncio.gather(
                outage_watch,
                *(lane.watcher for lane in self._lanes if lane.watcher is not None),
                *self._background,
                return_exceptions=True,
            )
            if self._timer is not None:
                self._timer.cancel()
        return EngineOutcome(
            dispatched=self._dispatched,
            recorded=self._recorded,
            pending=self._dispatched - self._recorded,
            requeued=self._requeues,
            halted=self._halt_reason,
        )

    async def _drive(self) -> None:
        while True:
            await self._fill()
            if self._halt_reason is not None:
                return
            if not self._running:
                if self._exhausted and not self._requeued:
                    return
                if self._replacing == 0 and not any(not lane.retired for lane in self._lanes):
                    self.halt(f"no rollout server left: {self._last_loss}")
                    return
            await self._wake.wait()
            self._wake.clear()
            self._harvest()

    async def _fill(self) -> None:
        concurrency = self.settings.concurrency
        # An attempt being stored (waiting for its journal fsync) holds no slot: a slow disk
        # must not idle the rollouts. At most `concurrency` of them wait at once (memory).
        while (
            self._halt_reason is None
            and self._outage is None
            and self._in_flight < concurrency
            and len(self._running) < _running_bound(self.settings)
        ):
            solo = bool(self._requeued) and _key(self._requeued[0]) in self._suspects
            lane = self._pick(solo=solo)
            if lane is None:
                return
            item = await self._next_item()
            if item is None:
                return
            run = _Running(item=item, rollout_id=self._rollout_id(), lane=lane)
            lane.solo = run.solo = solo
            lane.load += 1
            self._in_flight += 1
            task = asyncio.create_task(self._attempt(run))
            task.add_done_callback(lambda _: self._wake.set())
            self._running[task] = run

    def _pick(self, *, solo: bool = False) -> _Lane | None:
        """The live endpoint with the fewest attempts in flight that has room for one more
        (`solo`: an idle one)."""
        now = time.monotonic()
        best: _Lane | None = None
        for lane in self._lanes:
            if (
                lane.has_room(now)
                and (not solo or lane.load == 0)
                and (best is None or lane.load < best.load)
            ):
                best = lane
        if best is None:
            cooling = [lane.cool_until for lane in self._lanes if lane.cool_until > now]
            if cooling:
                self._wake_at(min(cooling))  # a 429's Retry-After is over: look again
        return best

    def _rollout_id(self) -> str:
        if not self._ids:
            pool = os.urandom(16 * _ID_BATCH).hex()
            self._ids = [pool[start : start + 32] for start in range(0, len(pool), 32)]
        return self._ids.pop()

    async def _next_item(self) -> WorkItem | None:
        if self._requeued:
            return self._requeued.popleft()
        if self._exhausted or self._source is None:
            return None
        try:
            item = await anext(self._source)
        except StopAsyncIteration:
            self._exhausted = True
            return None
        self._dispatched += 1
        return item

    def _harvest(self) -> None:
        """Read the result of every finished attempt task (exact accounting)."""
        for task in [task for task in self._running if task.done()]:
            run = self._running.pop(task)
            self._release(run)
            self.bridge.forget(run.rollout_id)  # memory follows what is in flight
            if run.recorded:
                self._recorded += 1
                self._suspects.discard(_key(run.item))
            if task.cancelled():
                if run.requeue is not None:
                    self._requeue(run.item, run.requeue, counts=run.counts)
                continue  # cancelled by a halt or an interrupt: pending
            error = task.exception()
            if error is not None:
                self.halt(
                    f"attempt row {run.item.row_index} run {run.item.run_index} "
                    f"(rollout {run.rollout_id}) failed unexpectedly: "
                    f"{type(error).__name__}: {error}"
                )
                continue
            requeue = task.result()
            if requeue is not None:
                self._requeue(run.item, requeue.reason, counts=requeue.counts)

    def _release(self, run: _Running) -> None:
        """Give back the attempt's concurrency slot and its share of its endpoint (once)."""
        if run.released:
            return
        run.released = True
        self._in_flight -= 1
        run.lane.load -= 1
        if run.solo:
            run.lane.solo = False

    def _requeue(self, item: WorkItem, reason: str, *, counts: bool) -> None:
        if self._halt_reason is not None or self._stopping:
            return  # the run is stopping: it stays pending
        key = (item.row_index, item.run_index)
        if counts:
            times = self._requeue_counts[key] = self._requeue_counts.get(key, 0) + 1
            if times > self.settings.max_requeues:
                self.halt(
                    f"row {item.row_index} run {item.run_index} went back to pending "
                    f"{times - 1} times; last: {reason}"
                )
                return
            self.sink.log(f"row {item.row_index} run {item.run_index}: back to pending ({reason})")
        self._requeues += 1
        self._requeued.append(item)

    async def _drain(self, *, stopping: bool = False) -> None:
        """Cancel what is still in flight (on the endpoints too) and read every result."""
        if stopping:
            self._stopping = True
        self._harvest()
        if not self._running:
            return
        # Our tasks go first: while an endpoint's cancel call is awaited, a task could still
        # record the "cancelled" result that very call produces, as a failed attempt. A
        # finished attempt being recorded is left to finish (RECORD_AFTER_SEC and a store at
        # most): cut short, it would be on disk yet counted as pending.
        by_lane: dict[_Lane, list[str]] = {}
        for task, run in self._running.items():
            if run.recording:
                continue
            task.cancel()
            by_lane.setdefault(run.lane, []).append(run.rollout_id)
        await asyncio.gather(*self._running, return_exceptions=True)
        self._harvest()
        await asyncio.gather(
            *(
                self._cancel_remote(lane, ids)
                for lane, ids in by_lane.items()
                if not lane.endpoint.dead.is_set()
            )
        )

    # -- one attempt ------------------------------------------------------------------------
    async def _attempt(self, run: _Running) -> _Requeue | None:
        """Run one attempt; None once its record is written, else why it goes back."""
        started = time.monotonic()
        outcome = await self._roll(run)
        if isinstance(outcome, _Requeue):
            return outcome
        result = outcome
        if result.status is not RolloutStatus.SUCCESS:
            queued = self._queued_too_long(run, result, time.monotonic() - started)
            if queued is not None:
                return _Requeue(queued, counts=False)
            fault = await self._system_fault(run.rollout_id, result, time.monotonic() - started)
            if fault is not None:
                return _Requeue(fault, counts=False)
        duration_ms = (time.monotonic() - started) * 1000
        # The attempt is over: a call made under its id from now on is refused, so every call
        # the provider answers is in the calls taken here (or counted late by the bridge).
        self.bridge.close_rollout(run.rollout_id)
        calls = list(self.bridge.take_calls(run.rollout_id))
        if result.status is not RolloutStatus.SUCCESS and any(
            call.status_code in (502, 503) for call in calls
        ):
            # The bridge answers 502/503 only when the provider, not the rollout, failed.
            return _Requeue("the model bridge answered 502/503")
        endpoint = run.lane.endpoint
        trial_dir = await endpoint.trial(run.rollout_id)
        finished_at = datetime.now(UTC)
        # From here on the attempt is done: an endpoint's death or an outage no longer sends
        # it back, and a halt waits for it rather than cancelling a half-stored record.
        run.recording = True
        self._release(run)  # the rollout is over: the next attempt may start meanwhile
        self._wake.set()
        await self._record_time()
        record = classify(
            run.item,
            result,
            calls,
            rollout_id=run.rollout_id,
            duration_ms=duration_ms,
            endpoint=endpoint.name,
            node=endpoint.node,
            finished_at=finished_at,
        )
        trajectory = attempt_trajectory(run.item, result, record, calls, trial_dir=trial_dir)
        await self.sink.store(
            FinishedAttempt(record=record, trajectory=trajectory, trial_dir=trial_dir)
        )
        run.recorded = True
        if self.on_record is not None:
            self.on_record(record)
        return None

    async def _record_time(self) -> None:
        """Return when this attempt's record is to be made: with the others that finished
        within RECORD_AFTER_SEC of the first of them; now if nothing is in flight, or if
        `_fill` would dispatch no more (its bound on the attempts running or being
        recorded): records waiting for their wave must not hold the next attempts back."""
        due = self._records_due
        if due is None:
            loop = asyncio.get_running_loop()
            due = self._records_due = loop.create_future()
            loop.call_later(RECORD_AFTER_SEC, self._records_now, due)
        if self._in_flight == 0 or len(self._running) >= _running_bound(self.settings):
            self._records_now(due)
        await asyncio.shield(due)  # one attempt cancelled must not cancel the others' wait

    def _records_now(self, due: asyncio.Future[None]) -> None:
        if self._records_due is due:
            self._records_due = None
        if not due.done():
            due.set_result(None)

    async def _roll(self, run: _Running) -> RolloutResultResponse | _Requeue:
        """Admit the rollout on its endpoint and wait for its terminal result."""
        lane, rollout_id = run.lane, run.rollout_id
        api = lane.endpoint.api
        # Built, not validated: every field is the engine's own (ids, URLs, settings) or a
        # dataset row already validated when it was read.
        request = RolloutInitRequest.model_construct(
            rollout_id=rollout_id,
            initial_messages=run.item.messages,
            label=run.item.label,
            metadata=run.item.metadata,
            chat_completions_url=self.bridge.open_rollout(rollout_id),
            llm_api_key=self.bridge.token,
            agent_timeout_sec=self.settings.agent_timeout_sec,
            grader_timeout_sec=self.settings.grader_timeout_sec,
            extra_fields={"row_index": run.item.row_index, "run_index": run.item.run_index},
        )
        try:
            lease = await self._admit(lane, request)
        except AdmissionRejected as rejected:
            return _failure(rollout_id, f"{PROTOCOL_ERROR}: {rejected}")
        except AtCapacity as busy:
            self._cool(lane, busy.retry_after_sec)
            return _Requeue(str(busy), counts=False)
        except MalformedResponse as malformed:
            self._spawn(self._cancel_remote(lane, [rollout_id]))
            return _failure(rollout_id, f"{PROTOCOL_ERROR}: admission: {malformed}")
        except RolloutServerUnavailable as fault:
            return await self._unreachable(run, fault)
        lane.busy_since = None
        try:
            result = await api.wait(lease, deadline_sec=self.settings.supervisor_deadline_sec)
        except ResultDeadlineExceeded as exceeded:
            self._spawn(self._cancel_remote(lane, [rollout_id]))
            return _failure(rollout_id, str(exceeded), ErrorCategory.TIMEOUT)
        except MalformedResponse as malformed:
            self._spawn(self._cancel_remote(lane, [rollout_id]))
            return _failure(rollout_id, f"{PROTOCOL_ERROR}: {malformed}")
        except RolloutServerUnavailable as fault:
            return await self._unreachable(run, fault)
        if result.status is RolloutStatus.CANCELLED:
            # We never wait for a result we cancelled: the endpoint dropped it (shutting down).
            self._suspect(lane, "it cancelled a rollout the engine did not cancel")
            return _Requeue(f"endpoint {lane.endpoint.name} cancelled the rollout")
        return result

    async def _admit(self, lane: _Lane, request: RolloutInitRequest) -> Lease:
        if lane.ramp <= 0:
            return await lane.endpoint.api.start(request)
        lane.ramp -= 1
        async with lane.admitting:
            return await lane.endpoint.api.start(request)

    async def _unreachable(
        self, run: _Running, fault: RolloutServerUnavailable
    ) -> RolloutResultResponse | _Requeue:
        """The endpoint did not answer. If it died, `_retire` cancels this attempt (pending)
        or charges it with the resource limit that killed it (then it fails with that)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(run.lane.endpoint.dead.wait(), _DEATH_NOTICE_SEC)
        if run.breach is not None:
            return _breached(run.rollout_id, run.breach)
        self._suspect(run.lane, str(fault))
        return _Requeue(str(fault))

    def _queued_too_long(
        self, run: _Running, result: RolloutResultResponse, elapsed: float
    ) -> str | None:
        """Why a failed attempt is the rate limit's fault, if it is: its model call still waits
        on the provider's rate limit unserved (for a slot of the bridge's adaptive limit, or
        for a retry after a 429), or it timed out only because of such waits (its time minus
        them is within its deadline). It goes back to pending, not failed `timeout`; counted
        and said in the log. A provider merely slow to answer still makes a `timeout`."""
        waited, waiting = self.bridge.rate_wait(run.rollout_id)
        deadline = self.settings.agent_timeout_sec
        timed_out = result.err_category is ErrorCategory.TIMEOUT
        if not waiting and not (
            timed_out and deadline is not None and waited > 0 and elapsed - waited < deadline
        ):
            return None
        self.rate_requeues += 1
        reason = (
            f"its model calls waited {waited:.1f} s on the provider's rate limit, unserved (for "
            "a slot of the adaptive limit or a retry after 429), as its deadline passed"
        )
        self.sink.log(
            f"row {run.item.row_index} run {run.item.run_index}: back to pending ({reason}; "
            f"{self.rate_requeues} attempts so far)"
        )
        return reason

    async def _system_fault(
        self, rollout_id: str, result: RolloutResultResponse, elapsed: float
    ) -> str | None:
        """Why a failed result is the provider's fault rather than the rollout's, if it is."""
        if rollout_id in self.bridge.stuck_rollouts():
            if await self.bridge.stalled(rollout_id):
                # The provider answered nobody since this call was sent: a stall shorter than
                # the stall window, not this attempt's timeout.
                return "model provider stalled: no call answered before the attempt's deadline"
            # Failed while its model call is still outstanding (an agent deadline shorter than
            # the bridge's stall window): wait until the call is answered or an outage is
            # declared, whichever comes first.
            give_up = time.monotonic() + self.settings.verdict_wait_sec
            while (
                not self.bridge.outage.is_set()
                and rollout_id in self.bridge.stuck_rollouts()
                and time.monotonic() < give_up
            ):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.bridge.outage.wait(), _VERDICT_POLL_SEC)
        stalled = self.bridge.stall_time(rollout_id)
        deadline = self.settings.agent_timeout_sec
        if (
            result.err_category is ErrorCategory.TIMEOUT
            and deadline is not None
            and stalled > 0
            and elapsed - stalled < deadline
        ):
            # Its calls were answered once a stall ended, too late: its own time was short.
            return (
                f"model provider stalled: its calls waited {stalled:.1f} s in a stall a probe "
                "confirmed, and it timed out only because of that"
            )
        if self.bridge.outage.is_set():
            return f"model provider outage: {self.bridge.outage_reason or 'unavailable'}"
        return None

    # -- endpoints --------------------------------------------------------------------------
    def _add(self, endpoint: Endpoint) -> None:
        lane = _Lane(endpoint=endpoint, ramp=self.settings.concurrency)
        lane.watcher = asyncio.create_task(self._watch_endpoint(lane))
        self._lanes.append(lane)
        self._wake.set()

    async def _watch_endpoint(self, lane: _Lane) -> None:
        endpoint = lane.endpoint
        await endpoint.dead.wait()
        self._retire(lane, endpoint.death_reason or f"{endpoint.name} is gone", endpoint.breach)

    def _cool(self, lane: _Lane, seconds: float) -> None:
        now = time.monotonic()
        lane.cool_until = max(lane.cool_until, now + seconds)
        lane.ramp = self.settings.concurrency  # a full server gets its slots back gently
        if lane.busy_since is None:
            lane.busy_since = now
        elif now - lane.busy_since > self.settings.admission_wait_sec:
            self._retire(
                lane,
                f"{lane.endpoint.name} answered only 429 for "
                f"{self.settings.admission_wait_sec:g} s",
            )

    def _suspect(self, lane: _Lane, fault: str) -> None:
        """An attempt could not reach the endpoint: ask its /health once, retire it if that
        fails too."""
        if lane.retired or lane.probing:
            return
        lane.probing = True
        self._spawn(self._probe(lane, fault))

    async def _probe(self, lane: _Lane, fault: str) -> None:
        endpoint = lane.endpoint
        try:
            await asyncio.wait_for(endpoint.api.health(), _HEALTH_PROBE_SEC)
        except Exception as error:  # whatever the transport says, it did not answer
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(endpoint.dead.wait(), _DEATH_NOTICE_SEC)
            reason = endpoint.death_reason or (
                f"rollout endpoint {endpoint.name} stopped answering ({fault}; "
                f"GET /health: {type(error).__name__}: {error})"
            )
            self._retire(lane, reason, endpoint.breach)
        finally:
            lane.probing = False

    def _retire(self, lane: _Lane, reason: str, breach: ResourceLimitBreach | None = None) -> None:
        """The endpoint is gone: its attempts go back to pending; ask the site for another.
        `breach`: the resource limit that killed it, when one did (the sandbox site)."""
        if lane.retired:
            return
        lane.retired = True
        endpoint = lane.endpoint
        drained = [
            (t, r)
            for t, r in self._running.items()
            if r.lane is lane and not t.done() and not r.recording
        ]
        # A resource limit is the doing of an attempt: the one alone on the endpoint is
        # charged with it; several are suspects.
        limit = breach is not None
        charged = drained[0][1] if limit and len(drained) == 1 else None
        if charged is not None:
            fate = (
                f"the attempt alone on it (row {charged.item.row_index} run "
                f"{charged.item.run_index}) fails {RESOURCE_LIMIT}"
            )
        else:
            fate = f"{len(drained)} attempts in flight on it go back to pending" + (
                ", each to re-run alone" if limit and drained else ""
            )
        self.sink.log(
            f"rollout endpoint {endpoint.name} ({endpoint.node}) is gone: {reason}; {fate}"
        )
        for task, run in drained:
            if run is charged:
                run.breach = breach  # not cancelled: it fails as soon as its call returns
                continue
            run.requeue = f"endpoint {endpoint.name} is gone"
            if limit:
                run.counts = False
                self._suspects.add(_key(run.item))
            task.cancel()
        self._last_loss = reason
        if self._halt_reason is None and not self._stopping:
            self._replacing += 1
            self._spawn(self._replace(lane, reason))
        self._wake.set()

    async def _replace(self, lane: _Lane, reason: str) -> None:
        try:
            endpoint = await self.site.replace(lane.endpoint, reason)
        except Exception as error:  # the site's own words: budget spent, start failure
            self._last_loss = f"{reason}; no replacement: {error}"
            self.sink.log(f"rollout endpoint {lane.endpoint.name} not replaced: {error}")
        else:
            self.sink.log(f"rollout endpoint {endpoint.name} serving at {endpoint.base_url}")
            self._add(endpoint)
        finally:
            self._replacing -= 1
            self._wake.set()

    async def _cancel_remote(self, lane: _Lane, rollout_ids: list[str]) -> None:
        # The endpoint may be gone or stuck; then there is nothing more to stop.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(lane.endpoint.api.cancel(rollout_ids), _REMOTE_CANCEL_SEC)

    # -- provider outages -------------------------------------------------------------------
    async def _watch_outage(self) -> None:
        outage = self.bridge.outage
        while True:
            await outage.wait()
            reason = self.bridge.outage_reason or "the model provider is unavailable"
            self._outage = reason
            stuck = self.bridge.stuck_rollouts()
            hit = [
                (task, run)
                for task, run in self._running.items()
                if run.rollout_id in stuck and not task.done() and not run.recording
            ]
            self.sink.log(
                f"model provider outage: {reason}; dispatch paused, {len(hit)} attempts "
                "waiting on the model go back to pending and will re-run from the start"
            )
            for task, run in hit:
                run.requeue, run.counts = "model provider outage", False
                task.cancel()
                self._spawn(self._cancel_remote(run.lane, [run.rollout_id]))
            self._wake.set()
            began = time.monotonic()
            if not await self.bridge.wait_recovered(self.settings.outage_wait_sec):
                self.halt(
                    f"the model provider stayed unavailable for more than "
                    f"{self.settings.outage_wait_sec:g} s: {reason}"
                )
                return
            self._outage = None
            for lane in self._lanes:  # every free slot refills at once: pace them again
                lane.ramp = self.settings.concurrency
            self.sink.log(
                f"model provider answers again after {time.monotonic() - began:.1f} s; "
                "dispatch resumes"
            )
            self._wake.set()

    # -- helpers ----------------------------------------------------------------------------
    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _wake_at(self, when: float) -> None:
        """Wake the dispatch loop at `when` (time.monotonic()), or earlier if already due."""
        if self._timer is not None:
            if self._timer_at <= when:
                return
            self._timer.cancel()
        self._timer_at = when
        self._timer = asyncio.get_running_loop().call_later(
            max(0.0, when - time.monotonic()), self._timer_fired
        )

    def _timer_fired(self) -> None:
        self._timer = None
        self._wake.set()


def _key(item: WorkItem) -> tuple[int, int]:
    return (item.row_index, item.run_index)


def _running_bound(settings: EngineSettings) -> int:
    """The most attempts running or being recorded at once (`Engine._fill`)."""
    return 2 * settings.concurrency


def _failure(
    rollout_id: str, message: str, category: ErrorCategory | None = None
) -> RolloutResultResponse:
    return RolloutResultResponse(
        rollout_id=rollout_id,
        status=RolloutStatus.FAILURE,
        err_message=message,
        err_category=category,
    )


def _breached(rollout_id: str, breach: ResourceLimitBreach) -> RolloutResultResponse:
    return ResultWithBreach(
        rollout_id=rollout_id,
        status=RolloutStatus.FAILURE,
        err_message=str(breach),
        breach=breach,
    )


async def _aiter(items: Iterable[WorkItem] | AsyncIterator[WorkItem]) -> AsyncIterator[WorkItem]:
    if isinstance(items, AsyncIterator):
        async for item in items:
            yield item
    else:
        for item in items:
            yield item


__all__ = [
    "DEFAULT_OUTAGE_WAIT_SEC",
    "SUPERVISOR_GRACE_SEC",
    "Engine",
    "EngineOutcome",
    "EngineSettings",
    "PolicyBridge",
    "ResultsSink",
]
