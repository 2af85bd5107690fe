"""Adaptive concurrency for provider calls: one AIMD limit per (provider, base URL, model, key).

A provider's rate limit is per key, not per run: two runs (or two bridges) on one key that
each send as much as their `max_in_flight` allows fight, and both collect 429s. So the limit
on calls in flight lives in a process-wide registry (`shared_limit`), keyed by what the
provider counts against (`limit_key`: provider, base URL, model and a hash of the key, never
the key itself), and every bridge of the process on that key takes its calls' slots from it.

AIMD, as TCP does it:

- it starts at `INITIAL_LIMIT` and, while calls succeed with every slot taken, grows by one
  per answered call (doubling per round trip) until the first 429, then by one per limit's
  worth of answered calls (one per round trip);
- a 429 or an overload answer (503, 529) sets it to `DECREASE` times the calls in flight (at
  most once per round trip: only a call sent after the last cut can cut it again, so one
  burst of 429s is one signal), never below 1;
- it never exceeds the largest `max_in_flight` among the bridges using it (`ceiling`).

Waiting calls are served in turn by owner (a bridge: one run), first come, first served
within each, so two runs on one key that both want more than the limit get half each,
whichever queued its calls first.

    limit = shared_limit(limit_key(target), ceiling=128)
    completion = await limit.call(lambda: transport.complete(body), owner=bridge)
    limit.limit, limit.throttled       # current limit; 429s seen by every user of the key

Only this process shares it: platform workers in other processes each adapt on their own
(they converge on their share, as TCP flows do, at the price of more 429s).
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TypeVar

from osmosis.eval.model.providers import ModelTarget, ProviderError

__all__ = [
    "DECREASE",
    "INITIAL_LIMIT",
    "OVERLOAD_STATUSES",
    "AdaptiveLimit",
    "LimitKey",
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
DEFAULT_CEILING = 1024
"""The ceiling of a limit whose bridges name no `max_in_flight`."""


def limit_key(target: ModelTarget) -> LimitKey:
    """What `target`'s calls count against at the provider; the key only as a hash.

    limit_key(target)  # ('openai', 'https://api.openai.com/v1', 'gpt-4o-mini', '3f2a…')
    """
    secret = "\0".join(target.secrets())
    digest = hashlib.sha256(secret.encode()).hexdigest()[:16] if secret else ""
    return (target.provider or target.kind, target.api_base or "", target.model, digest)


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
        self._limit = float(min(INITIAL_LIMIT, ceiling))
        self.in_flight = 0
        self.throttled = 0
        """429 and overload answers seen by every user of the limit."""
        self._slow_start = True
        self._last_cut = 0.0
        self._lock = threading.Lock()
        self._waiters: dict[object, deque[_Waiter]] = {}  # by owner, in turn order

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
            self._limit = min(self._limit, float(self.ceiling))

    async def call(self, attempt: Callable[[], Awaitable[_T]], *, owner: object) -> _T:
        """Await `attempt()` inside a slot, queued with `owner`'s other calls; its answer moves
        the limit."""
        sent = await self._acquire(owner)
        try:
            result = await attempt()
        except ProviderError as error:
            throttled = error.status in OVERLOAD_STATUSES
            self._release(sent, "throttled" if throttled else "other")
            raise
        except BaseException:
            self._release(sent, "other")
            raise
        self._release(sent, "ok")
        return result

    async def _acquire(self, owner: object) -> float:
        with self._lock:
            if not self._waiters and self.in_flight < self.limit:
                self.in_flight += 1
                return time.monotonic()
            waiter = _Waiter(asyncio.get_running_loop())
            self._waiters.setdefault(owner, deque()).append(waiter)
        try:
            await waiter.future
        except asyncio.CancelledError:
            with self._lock:
                if waiter.granted:
                    self.in_flight -= 1  # granted as we were cancelled: pass the slot on
                else:
                    queue = self._waiters[owner]
                    queue.remove(waiter)
                    if not queue:
                        del self._waiters[owner]
                self._grant()
            raise
        return time.monotonic()

    def _release(self, sent: float, how: str) -> None:
        with self._lock:
            # Binding: this call found every slot taken or calls waiting; only then does a
            # success say the provider would take more.
            binding = bool(self._waiters) or self.in_flight >= self.limit
            self.in_flight -= 1
            if how == "throttled":
                self.throttled += 1
                if sent >= self._last_cut:  # a burst of 429s from one round trip: one cut
                    # Cut from what was really in flight: a limit nobody reached says nothing.
                    flight = min(self._limit, float(self.in_flight + 1))
                    self._limit = max(1.0, flight * DECREASE)
                    self._slow_start = False
                    self._last_cut = time.monotonic()
            elif how == "ok" and binding:
                step = 1.0 if self._slow_start else 1.0 / self._limit
                self._limit = min(float(self.ceiling), self._limit + step)
            self._grant()

    def _grant(self) -> None:
        """Hand free slots to waiters: owners in turn, oldest first within each (the lock is
        held)."""
        while self._waiters and self.in_flight < self.limit:
            owner, queue = next(iter(self._waiters.items()))
            waiter = queue.popleft()
            del self._waiters[owner]
            if queue:
                self._waiters[owner] = queue  # to the back of the turn order
            waiter.granted = True
            self.in_flight += 1
            waiter.loop.call_soon_threadsafe(_wake, waiter.future)


class _Waiter:
    """A call waiting for a slot, on its own event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()
        self.granted = False


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():  # a cancelled waiter gave its slot back already
        future.set_result(None)


_registry: dict[LimitKey, AdaptiveLimit] = {}
_registry_lock = threading.Lock()


def shared_limit(key: LimitKey, *, ceiling: int | None = None) -> AdaptiveLimit:
    """The process's limit for `key`, created on first use; `ceiling` (a run's
    `max_in_flight`) raises its ceiling when larger than what it had."""
    with _registry_lock:
        limit = _registry.get(key)
        if limit is None:
            limit = _registry[key] = AdaptiveLimit(key, ceiling=ceiling or DEFAULT_CEILING)
        elif ceiling is not None:
            limit.raise_ceiling(ceiling)
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
