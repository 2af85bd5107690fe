"""Adaptive concurrency for provider calls: one AIMD limit per (provider, base URL, model, key).

A provider's rate limit is per key, not per run: two runs (or two bridges) on one key that
each send as much as their `max_in_flight` allows fight, and both collect 429s. So the limit
on calls in flight lives in a process-wide registry (`shared_limit`), keyed by what the
provider counts against (`limit_key`: provider, base URL, model and a hash of the key, never
the key itself), and every bridge of the process on that key takes its calls' slots from it.

AIMD, as TCP does it:

- it starts at the run's `max_in_flight` (the ceiling a bridge names: what the user says the
  provider takes; a provider that disagrees answers the first burst 429, one cut), or at
  `INITIAL_LIMIT` when no bridge names one; while calls succeed with every slot taken it
  grows by one per answered call (doubling per round trip) until the first 429, then by one
  per limit's worth of answered calls (one per round trip). Starting low cost a healthy
  provider at 200 ms latency 0.3x of the ideal dispatch time (three round trips from 8 to 64
  in flight);
- a 429 or an overload answer (503, 529) sets it to `DECREASE` times the calls in flight (at
  most once per round trip: only a call sent after the last cut can cut it again, so one
  burst of 429s is one signal), never below 1;
- it never exceeds the largest `max_in_flight` among the bridges using it (`ceiling`);
- the slot of a call answered 429 stays taken for the provider's Retry-After (else the
  call's round trip): a 429 comes back at once, and handing its slot on at once would send
  every waiting call into the same refusal.

Waiting calls are served in turn by owner (a bridge: one run), so two runs on one key that
both want more than the limit get half each, whichever queued its calls first. Within an
owner, the lowest `priority` goes first, then first come: the bridge gives each call the time
its attempt's first call began, so an attempt under way is served before new ones start (under
a tight limit, first come first served would hold every attempt's next call behind every
other attempt's, and none would finish in its deadline).

    limit = shared_limit(limit_key(target), ceiling=128)
    completion = await limit.call(lambda: transport.complete(body), owner=bridge)
    limit.limit, limit.throttled       # current limit; 429s seen by every user of the key

Across processes a `LimitCoordinator` shares it (`install_coordinator`; the platform worker
installs `osmosis.platform.worker.model_limits.DatabaseLimits`, so every worker on one key
shares one limit through the database). A 429 still cuts a coordinated limit at once, but
answers grow only the global limit; the limit reports what happened (`take_report`): the
coordinator
cuts the key's global limit (once per round trip, however many workers saw the burst), adds
the increases, and gives each process its share (`adopt`), by demand among the processes
using the key. Without a coordinator (`eval run`) nothing leaves the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import heapq
import itertools
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from osmosis.eval.model.providers import ModelTarget, ProviderError

__all__ = [
    "DECREASE",
    "INITIAL_LIMIT",
    "OVERLOAD_STATUSES",
    "AdaptiveLimit",
    "LimitCoordinator",
    "LimitKey",
    "LimitReport",
    "RateWaits",
    "install_coordinator",
    "limit_key",
    "shared_limit",
    "traffic",
]

_T = TypeVar("_T")

LimitKey = tuple[str, str, str, str]
"""(provider, base URL, model, key hash): what a provider's rate limit counts against."""

INITIAL_LIMIT = 8
"""Calls in flight before the first answers say more are welcome."""
DECREASE = 0.85
"""The share of the limit kept after a 429: gentler than TCP's 0.5, because a provider's
limit is a rate that stays put, not a queue that must drain."""
OVERLOAD_STATUSES = frozenset({429, 503, 529})
"""Answers that mean "too much": 429 rate limited, 503 overloaded, 529 Anthropic's overload."""
_MIN_HOLD = 0.01
_MAX_HOLD = 10.0
"""Bounds on how long a slot stays taken after a 429 (the provider's Retry-After)."""
DEFAULT_CEILING = 1024
"""The ceiling of a limit whose bridges name no `max_in_flight`."""


def limit_key(target: ModelTarget) -> LimitKey:
    """What `target`'s calls count against at the provider; the key only as a hash.

    limit_key(target)  # ('openai', 'https://api.openai.com/v1', 'gpt-4o-mini', '3f2a…')
    """
    secret = "\0".join(target.secrets())
    digest = hashlib.sha256(secret.encode()).hexdigest()[:16] if secret else ""
    return (target.provider or target.kind, target.api_base or "", target.model, digest)


@dataclass(frozen=True)
class LimitReport:
    """What a limit saw since its last report, for a coordinator (`AdaptiveLimit.take_report`)."""

    grown: int
    """Answered calls that found every slot taken (each would grow the limit)."""
    cut_sent: float | None
    """Wall-clock time (`time.time()`) at which the call that last cut the limit was sent;
    None: no cut. A global cut is due only if it was sent after the global limit's last cut."""
    throttled: int
    """429 and overload answers since the last report."""
    demand: int
    """Calls in flight and waiting now, at most `ceiling`: the share this process wants."""
    ceiling: int


class LimitCoordinator(Protocol):
    """Shares limits beyond this process (see the module doc)."""

    def attach(self, limit: AdaptiveLimit) -> None:
        """Start sharing `limit` (called once per limit, on first use of its key)."""


class AdaptiveLimit:
    """An AIMD limit on calls in flight to one provider key (see the module doc).

    Thread-safe: bridges on different event loops may share it; a waiter is woken on its own
    loop.
    """

    def __init__(self, key: LimitKey, *, ceiling: int = DEFAULT_CEILING) -> None:
        if ceiling < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {ceiling}")
        self.key = key
        self.ceiling = ceiling
        self._named = ceiling != DEFAULT_CEILING
        self._limit = float(ceiling if self._named else min(INITIAL_LIMIT, ceiling))
        self.in_flight = 0
        self.throttled = 0
        """429 and overload answers seen by every user of the limit."""
        self._slow_start = True
        self._last_cut = 0.0
        self._lock = threading.Lock()
        # By owner, in turn order; each a heap by (priority, arrival).
        self._waiters: dict[object, list[_Waiter]] = {}
        self._arrivals = itertools.count()
        self.waiting = 0
        """Calls waiting for a slot now (not yet sent to the provider)."""
        self._holds: list[float] = []  # when slots held after a 429 free up (monotonic)
        self._timer_at = 0.0  # when a `_regrant` is due; 0: none
        # For a coordinator: what happened since the last `take_report`.
        self._grown = 0
        self._cut_sent: float | None = None
        self._throttled_reported = 0
        self.on_cut: Callable[[], None] | None = None
        """Called (under the lock: keep it short) when a 429 cuts the limit: a coordinator
        reports cuts at once."""
        self.shared: tuple[int, int] | None = None
        """(global limit, global 429 count) as the coordinator last saw them; None without one.
        While set, answers grow the global limit only (each process growing its own share
        too would probe past the provider's limit once per process)."""

    @property
    def limit(self) -> int:
        """Calls allowed in flight now."""
        return max(1, int(self._limit))

    def raise_ceiling(self, ceiling: int) -> None:
        """Let the limit grow to `ceiling` (another bridge with a larger `max_in_flight`); the
        first named ceiling replaces the default one."""
        with self._lock:
            self.ceiling = max(self.ceiling, ceiling) if self._named else ceiling
            self._named = True
            # Until the provider has refused anything, the named ceiling is the limit.
            uncut = self._slow_start and self.throttled == 0
            self._limit = float(self.ceiling) if uncut else min(self._limit, float(self.ceiling))

    def take_report(self) -> LimitReport:
        """What happened since the last report (see `LimitReport`); starts a new one."""
        with self._lock:
            report = LimitReport(
                grown=self._grown,
                cut_sent=self._cut_sent,
                throttled=self.throttled - self._throttled_reported,
                demand=min(self.ceiling, self.in_flight + self.waiting),
                ceiling=self.ceiling,
            )
            self._grown = 0
            self._cut_sent = None
            self._throttled_reported = self.throttled
        return report

    def restore(self, report: LimitReport) -> None:
        """Take back a report the coordinator could not deliver: the next one includes it."""
        with self._lock:
            self._grown += report.grown
            self._throttled_reported -= report.throttled
            if report.cut_sent is not None:
                self._cut_sent = max(self._cut_sent or 0.0, report.cut_sent)

    def detach(self) -> None:
        """The coordinator is gone: the limit adapts on its own again."""
        with self._lock:
            self.on_cut = None
            self.shared = None

    def adopt(self, share: float, *, shared: tuple[int, int]) -> None:
        """Take `share` calls in flight as the limit (the coordinator's verdict), within
        [1, ceiling]; `shared`: the global limit and 429 count, for display."""
        with self._lock:
            self._limit = max(1.0, min(float(self.ceiling), share))
            self.shared = shared
            if shared[1]:
                self._slow_start = False
            self._grant()

    async def call(
        self, attempt: Callable[[], Awaitable[_T]], *, owner: object, priority: float = 0.0
    ) -> _T:
        """Await `attempt()` inside a slot, queued with `owner`'s other calls (lowest
        `priority` first, then first come); its answer moves the limit."""
        sent = await self._acquire(owner, priority)
        try:
            result = await attempt()
        except ProviderError as error:
            throttled = error.status in OVERLOAD_STATUSES
            self._release(sent, "throttled" if throttled else "other", error.retry_after)
            raise
        except BaseException:
            self._release(sent, "other")
            raise
        self._release(sent, "ok")
        return result

    async def _acquire(self, owner: object, priority: float) -> float:
        with self._lock:
            if not self._waiters and self._busy() < self.limit:
                self.in_flight += 1
                return time.monotonic()
            waiter = _Waiter(asyncio.get_running_loop(), (priority, next(self._arrivals)))
            heapq.heappush(self._waiters.setdefault(owner, []), waiter)
            self.waiting += 1
            self._grant()  # a held slot may be free by now, or a wake-up is due when it is
        try:
            await waiter.future
        except asyncio.CancelledError:
            with self._lock:
                if waiter.granted:
                    self.in_flight -= 1  # granted as we were cancelled: pass the slot on
                else:
                    self.waiting -= 1
                    queue = self._waiters[owner]
                    queue.remove(waiter)
                    heapq.heapify(queue)
                    if not queue:
                        del self._waiters[owner]
                self._grant()
            raise
        return time.monotonic()

    def _release(self, sent: float, how: str, retry_after: float | None = None) -> None:
        with self._lock:
            # Binding: this call found every slot taken or calls waiting; only then does a
            # success say the provider would take more.
            binding = bool(self._waiters) or self._busy() >= self.limit
            self.in_flight -= 1
            if how == "throttled":
                # The slot stays taken for the wait the provider asked (else the call's round
                # trip): a 429 comes back at once, and handing its slot on at once would
                # send every waiting call into the same refusal, one after the other.
                now = time.monotonic()
                hold = retry_after if retry_after is not None else now - sent
                self._holds.append(now + min(max(hold, _MIN_HOLD), _MAX_HOLD))
                self.throttled += 1
                if sent >= self._last_cut:  # a burst of 429s from one round trip: one cut
                    # Cut from what was really in flight: a limit nobody reached says nothing.
                    flight = min(self._limit, float(self.in_flight + 1))
                    self._limit = max(1.0, flight * DECREASE)
                    self._slow_start = False
                    self._last_cut = time.monotonic()
                    self._cut_sent = time.time() - (self._last_cut - sent)
                    if self.on_cut is not None:
                        self.on_cut()
            elif how == "ok" and binding:
                self._grown += 1
                if self.shared is None:  # coordinated: the share grows with the global limit
                    step = 1.0 if self._slow_start else 1.0 / self._limit
                    self._limit = min(float(self.ceiling), self._limit + step)
            self._grant()

    def _busy(self) -> int:
        """Slots taken: calls in flight, and slots held after a 429 (the lock is held)."""
        if self._holds:
            now = time.monotonic()
            self._holds = [until for until in self._holds if until > now]
        return self.in_flight + len(self._holds)

    def _regrant(self) -> None:
        with self._lock:
            self._timer_at = 0.0
            self._grant()

    def _grant(self) -> None:
        """Hand free slots to waiters: owners in turn, oldest first within each (the lock is
        held); when held slots are what keeps them waiting, again once the first is free."""
        while self._waiters and self._busy() < self.limit:
            owner, queue = next(iter(self._waiters.items()))
            waiter = heapq.heappop(queue)
            del self._waiters[owner]
            if queue:
                self._waiters[owner] = queue  # to the back of the turn order
            waiter.granted = True
            self.waiting -= 1
            self.in_flight += 1
            waiter.loop.call_soon_threadsafe(_wake, waiter.future)
        if self._waiters and self._holds:
            free_at = min(self._holds)
            now = time.monotonic()
            # (a wake-up past due never came: its loop closed)
            if not self._timer_at or free_at < self._timer_at or self._timer_at < now - 1:
                self._timer_at = free_at
                loop = next(iter(self._waiters.values()))[0].loop
                delay = max(0.0, free_at - now)
                with contextlib.suppress(RuntimeError):  # its loop closed: nobody to wake
                    loop.call_soon_threadsafe(loop.call_later, delay, self._regrant)


class _Waiter:
    """A call waiting for a slot, on its own event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, order: tuple[float, int]) -> None:
        self.order = order
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()
        self.granted = False

    def __lt__(self, other: _Waiter) -> bool:
        return self.order < other.order


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():  # a cancelled waiter gave its slot back already
        future.set_result(None)


class RateWaits:
    """How long each rollout's calls waited on the provider's rate limit without being served:
    for a slot of the adaptive limit, or for a retry after a 429 / overload answer. The
    engine does not charge such waits to an attempt's deadline (a provider merely slow to
    answer a call it took is the attempt's). One per bridge, on its event loop.

        waits = RateWaits()
        call = waits.begin("r1")        # the call starts waiting (for a slot)
        waits.sent("r1", call)          # a slot: in the provider's hands
        waits.throttled("r1", call)     # answered 429: waiting again (backoff, a slot)
        waits.end("r1", call, keep=True)
        waits.wait("r1")                # (seconds waited, whether a call waits now)
    """

    def __init__(self) -> None:
        self._first: dict[str, float] = {}  # when each rollout's first call began
        self._waited: dict[str, float] = {}
        self._waiting: dict[str, dict[int, float]] = {}  # rollout: {call: waiting since}
        self._calls = itertools.count()

    def begin(self, rollout_id: str) -> int:
        call = next(self._calls)
        now = time.monotonic()
        self._first.setdefault(rollout_id, now)
        self._waiting.setdefault(rollout_id, {})[call] = now
        return call

    def first(self, rollout_id: str) -> float:
        """When the rollout's first call began (its calls' priority for a slot)."""
        return self._first.get(rollout_id, 0.0)

    def sent(self, rollout_id: str, call: int) -> None:
        self._stop(rollout_id, call, keep=True)

    def throttled(self, rollout_id: str, call: int) -> None:
        self._waiting.setdefault(rollout_id, {})[call] = time.monotonic()

    def end(self, rollout_id: str, call: int, *, keep: bool) -> None:
        """The call is over; `keep`: False once its rollout is forgotten (nothing is kept)."""
        self._stop(rollout_id, call, keep=keep)

    def forget(self, rollout_id: str) -> None:
        self._waited.pop(rollout_id, None)
        self._first.pop(rollout_id, None)

    def wait(self, rollout_id: str) -> tuple[float, bool]:
        """(seconds its calls waited, waits under way included; whether one waits now)."""
        now = time.monotonic()
        waiting = self._waiting.get(rollout_id, {})
        waited = self._waited.get(rollout_id, 0.0) + sum(now - t for t in waiting.values())
        return waited, bool(waiting)

    def _stop(self, rollout_id: str, call: int, *, keep: bool) -> None:
        waiting = self._waiting.get(rollout_id)
        since = waiting.pop(call, None) if waiting is not None else None
        if waiting is not None and not waiting:
            del self._waiting[rollout_id]
        if since is not None and keep:
            self._waited[rollout_id] = self._waited.get(rollout_id, 0.0) + time.monotonic() - since


_registry: dict[LimitKey, AdaptiveLimit] = {}
_registry_lock = threading.Lock()
_coordinator: LimitCoordinator | None = None


def install_coordinator(coordinator: LimitCoordinator | None) -> None:
    """Share this process's limits through `coordinator` (None: stop handing it new ones);
    the limits already in use are attached to it at once."""
    global _coordinator
    with _registry_lock:
        _coordinator = coordinator
        limits = list(_registry.values())
    if coordinator is not None:
        for limit in limits:
            coordinator.attach(limit)


def shared_limit(key: LimitKey, *, ceiling: int | None = None) -> AdaptiveLimit:
    """The process's limit for `key`, created on first use; `ceiling` (a run's
    `max_in_flight`) raises its ceiling when larger than what it had."""
    with _registry_lock:
        limit = _registry.get(key)
        created = limit is None
        if limit is None:
            limit = _registry[key] = AdaptiveLimit(key, ceiling=ceiling or DEFAULT_CEILING)
        elif ceiling is not None:
            limit.raise_ceiling(ceiling)
        coordinator = _coordinator
    if created and coordinator is not None:
        coordinator.attach(limit)
    return limit


def traffic() -> str:
    """` · model 10 in flight · 429s 32` for the process's limits (the progress line); "" while
    no bridge has run.

    traffic()  # ' · model 10 in flight · 429s 32'
    """
    with _registry_lock:
        limits = list(_registry.values())
    if not limits:
        return ""
    shown = "/".join(str(limit.limit) for limit in limits)
    return f" · model {shown} in flight · 429s {sum(limit.throttled for limit in limits):,}"
