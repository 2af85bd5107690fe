"""Noticing that the model provider is down, and noticing by itself that it is back.

The bridge routes every provider call through one `ProviderWatch`. The watch declares an
outage (`watch.outage` set, `watch.reason` says why) when:

- a call's retryable fault outlasts the retry policy (the bridge calls `declare`);
- `timeouts_in_a_row` calls in a row time out in the transport, with no answer between;
- calls sit in the transport and no answer of any kind (a completion or any HTTP error) has
  arrived for `stall_after_s` (a SIGSTOPped server, a wedged inference engine), and a
  confirming probe gets no answer within `probe_timeout_s` either. The probe is what keeps one
  long generation on an otherwise quiet bridge from counting as an outage.

Short of an outage, `stalled(rollout_id)` is the verdict for an attempt whose deadline passed
while its call waited: True when the provider answered nobody in the later half of that wait
and a probe confirms the silence (the outage rule for stalls shorter than `stall_after_s`).
A probe that gets no answer also confirms a stall, from the provider's last answer to its
next: `stall_time(rollout_id)` is how long that rollout's calls waited inside such stalls, so
that an attempt whose deadline passed just after a stall ended (its calls answered, too
late) is judged the provider's, not a `timeout`.

While declared it probes the provider (backoff from `probe_first_s`, doubling up to
`probe_max_s`) and clears the outage on the first probe that succeeds. Nothing else clears it
(except `clear()`, the engine's override): a stuck call that finally returns says little about
a provider that just stopped for a minute, and a probe costs one token.

    watch = ProviderWatch(OutagePolicy(stall_after_s=2), probe=send_one_token)
    watch.start()
    call = watch.enter("rollout-1")
    completion = await watch.through(call, transport.complete(body))
    watch.leave(call)
    if watch.outage.is_set(): await watch.wait_recovered(300)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from osmosis.eval.model.providers import ProviderError

__all__ = ["OutageDeclared", "OutagePolicy", "ProviderCall", "ProviderWatch"]

logger = logging.getLogger("osmosis.eval.model.bridge")

_T = TypeVar("_T")
ProbeAnswer = Literal["healthy", "answered", "silent"]
_SETTLE_S = 0.25  # after a stall, how far apart the waiting calls' answers may arrive
_STALLS_KEPT = 16  # confirmed stalls remembered: calls still waiting when one ended see it


@dataclass(frozen=True)
class OutagePolicy:
    """When the bridge declares the provider down, and how it probes for its return.

    OutagePolicy()                                   # 30 s of silence, 3 timeouts in a row
    OutagePolicy(stall_after_s=2, probe_timeout_s=0.5, probe_first_s=0.1, probe_max_s=0.5)
    """

    stall_after_s: float = 30.0
    """Seconds without any provider answer, while calls are waiting on it, before a confirming
    probe is sent. 30 s: short enough that agent deadlines rarely fire first, and a false alarm
    costs only a one-token probe."""
    timeouts_in_a_row: int = 3
    """Transport timeouts in a row (no answer in between) that declare an outage."""
    probe_timeout_s: float = 10.0
    """How long one probe may take before it counts as no answer."""
    probe_first_s: float = 1.0
    """Seconds before the first recovery probe; each later wait doubles."""
    probe_max_s: float = 30.0
    """The longest wait between recovery probes."""

    def __post_init__(self) -> None:
        problems = [
            f"{name} must be positive, got {value}"
            for name, value in (
                ("stall_after_s", self.stall_after_s),
                ("probe_timeout_s", self.probe_timeout_s),
                ("probe_first_s", self.probe_first_s),
                ("probe_max_s", self.probe_max_s),
            )
            if not value > 0
        ]
        if self.timeouts_in_a_row < 1:
            problems.append(f"timeouts_in_a_row must be at least 1, got {self.timeouts_in_a_row}")
        if problems:
            raise ValueError("; ".join(problems))

    def probe_wait(self, probe: int) -> float:
        """Seconds to wait before recovery probe number `probe` (1 for the first).

        OutagePolicy().probe_wait(3)  # 4.0
        """
        return float(min(self.probe_first_s * 2.0 ** max(probe - 1, 0), self.probe_max_s))


class OutageDeclared(Exception):
    """Raised out of a retry wait when an outage is declared meanwhile: stop retrying now."""


@dataclass(eq=False)
class ProviderCall:
    """One rollout request the bridge is serving (retries included)."""

    rollout_id: str
    task: asyncio.Task[object] | None
    """The task serving it, cancelled by `ProviderWatch.release`."""
    in_transport: bool = False
    """True while a provider attempt for it is under way (not between retries)."""
    released: bool = False
    """Set by `release`: the engine gave the rollout up; answer it 503 and record nothing."""
    sent_at: float = 0.0
    """When its current provider attempt was sent (time.monotonic())."""


@dataclass
class _State:
    in_transport: int = 0
    busy_since: float = 0.0
    last_answer: float = field(default_factory=time.monotonic)
    timeouts: int = 0
    declared_at: float = 0.0
    stall_from: float | None = None
    """When the stall a silent probe confirmed began (the last answer before it), until the
    next answer ends it; None when no confirmed stall is under way."""
    stalls: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=_STALLS_KEPT))
    """Confirmed stalls that ended: (from, to), time.monotonic()."""


class ProviderWatch:
    """Outage state for one bridge: declared, probed, cleared. See the module doc.

    `probe()` sends one cheap request through the bridge's transport and raises
    `ProviderError` when it fails; `scrub` hides secrets in the reasons it writes.
    """

    def __init__(
        self,
        policy: OutagePolicy,
        probe: Callable[[], Awaitable[object]],
        *,
        scrub: Callable[[str], str] = lambda text: text,
    ) -> None:
        self.policy = policy
        self.outage = asyncio.Event()
        """Set while the provider is declared down."""
        self.reason: str | None = None
        """Why the outage was declared (secrets scrubbed); None when there is none."""
        self._probe_call = probe
        self._scrub = scrub
        self._recovered = asyncio.Event()
        self._recovered.set()
        self._wake = asyncio.Event()
        self._calls: dict[str, set[ProviderCall]] = {}
        self._stalled_s: dict[str, float] = {}  # rollout: its ended calls' time in stalls
        self._state = _State()
        self._task: asyncio.Task[None] | None = None
        self._verdict_probe: asyncio.Task[tuple[ProbeAnswer, str]] | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start watching for stalls and probing during outages (inside the running loop)."""
        if self._task is None:
            self._task = asyncio.create_task(self._supervise(), name="model-provider-watch")

    async def stop(self) -> None:
        if self._verdict_probe is not None:
            self._verdict_probe.cancel()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- the calls being served --------------------------------------------------------------
    def enter(self, rollout_id: str) -> ProviderCall:
        """Register a request the current task now serves for `rollout_id`."""
        call = ProviderCall(rollout_id, asyncio.current_task())
        calls = self._calls.get(rollout_id)
        if calls is None:
            calls = self._calls[rollout_id] = set()
        calls.add(call)
        return call

    def leave(self, call: ProviderCall) -> None:
        calls = self._calls.get(call.rollout_id)
        if calls is not None:
            calls.discard(call)
            if not calls:
                del self._calls[call.rollout_id]

    async def through(self, call: ProviderCall, pending: Awaitable[_T]) -> _T:
        """Await one provider attempt for `call`, noting whether the provider answered."""
        state = self._state
        call.in_transport = True
        call.sent_at = time.monotonic()
        state.in_transport += 1
        if state.in_transport == 1:
            state.busy_since = time.monotonic()
            self._wake.set()
        try:
            result = await pending
        except ProviderError as error:
            self._failed(error)
            raise
        finally:
            call.in_transport = False
            state.in_transport -= 1
            if not call.released:
                stalled = self._in_stalls(call.sent_at)
                if stalled > 0:
                    rollout_id = call.rollout_id
                    self._stalled_s[rollout_id] = self._stalled_s.get(rollout_id, 0.0) + stalled
        self._answered()
        return result

    def stuck_rollouts(self) -> set[str]:
        """Rollout ids with a provider attempt under way now."""
        return {
            rollout_id
            for rollout_id, calls in self._calls.items()
            if any(call.in_transport for call in calls)
        }

    async def stalled(self, rollout_id: str) -> bool:
        """Whether `rollout_id`'s call in the transport waits on a provider that stopped
        answering everyone (for less than `stall_after_s`, else the outage rule applies), so
        that its attempt, past its deadline, is the provider's fault and not a `timeout`.

        True when the provider answered no call in the later half of this one's wait, and a
        probe confirms it: a probe answered while the call still waits a moment later says
        the provider is there and this call merely slow (one long generation on a quiet
        bridge). The probe is shared by every verdict asked while it is out.
        """
        sent = [c.sent_at for c in self._calls.get(rollout_id, ()) if c.in_transport]
        if not sent:
            return False
        # Answers to others in the later half of this call's wait: the provider works, this
        # call is slow. (One in the earlier half may precede a stall that began since.)
        since = min(sent)
        if self._state.last_answer >= since + (time.monotonic() - since) / 2:
            return False
        probe = self._verdict_probe
        if probe is None or probe.done():
            probe = self._verdict_probe = asyncio.ensure_future(self._probe())
        answer, _ = await asyncio.shield(probe)
        if answer == "silent":
            return True
        # A stall that ends answers every waiting call at once, the probe among them.
        await asyncio.sleep(_SETTLE_S)
        return rollout_id not in self.stuck_rollouts()

    def stall_time(self, rollout_id: str) -> float:
        """Seconds `rollout_id`'s provider attempts waited inside stalls a silent probe
        confirmed (attempts under way included). 0.0 when none did."""
        waiting = sum(
            self._in_stalls(call.sent_at)
            for call in self._calls.get(rollout_id, ())
            if call.in_transport
        )
        return self._stalled_s.get(rollout_id, 0.0) + waiting

    def _in_stalls(self, since: float) -> float:
        """Seconds from `since` to now that fall inside confirmed stalls."""
        state = self._state
        if not state.stalls and state.stall_from is None:
            return 0.0  # the provider never stalled: every call's case but an outage's
        now = time.monotonic()
        spans = list(state.stalls)
        if state.stall_from is not None:
            spans.append((state.stall_from, now))
        return sum(max(0.0, end - max(start, since)) for start, end in spans)

    def release(self, rollout_id: str) -> int:
        """Cancel every request still served for `rollout_id`; how many there were."""
        self._stalled_s.pop(rollout_id, None)
        released = 0
        for call in self._calls.get(rollout_id, ()):
            if not call.released and call.task is not None:
                call.released = True
                call.task.cancel()
                released += 1
        return released

    async def retry_sleep(self, seconds: float) -> None:
        """The retry policy's wait, cut short by an outage (raises `OutageDeclared`)."""
        if not self.outage.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await self.outage.wait()
        if self.outage.is_set():
            raise OutageDeclared(self.reason or "the model provider is unavailable")

    # -- declaring and clearing --------------------------------------------------------------
    def declare(self, reason: str) -> None:
        """Declare an outage (the first reason wins until it clears)."""
        if self.outage.is_set():
            return
        self.reason = self._scrub(reason)
        self._state.declared_at = time.monotonic()
        self._recovered.clear()
        self.outage.set()
        self._wake.set()
        logger.warning("model provider outage declared: %s", self.reason)

    def clear(self, why: str = "cleared by the engine") -> None:
        """End a declared outage (a successful probe does this by itself)."""
        if not self.outage.is_set():
            return
        state = self._state
        lasted = time.monotonic() - state.declared_at
        self.outage.clear()
        self.reason = None
        state.timeouts = 0
        state.last_answer = time.monotonic()
        self._recovered.set()
        self._wake.set()
        logger.warning("model provider outage over after %.1f s: %s", lasted, why)

    async def wait_recovered(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109
        """True once no outage is declared (at once if none is); False after `timeout` s."""
        if not self.outage.is_set():
            return True
        try:
            async with asyncio.timeout(timeout):
                await self._recovered.wait()
        except TimeoutError:
            return False
        return True

    # -- what the transport said ---------------------------------------------------------------
    def _answered(self) -> None:
        state = self._state
        state.last_answer = time.monotonic()
        state.timeouts = 0
        if state.stall_from is not None:
            state.stalls.append((state.stall_from, state.last_answer))
            state.stall_from = None

    def _failed(self, error: ProviderError) -> None:
        if error.status is not None:
            self._answered()  # an error status is still an answer: the provider is there
        elif error.cause == "timeout":
            self._state.timeouts += 1
            count = self.policy.timeouts_in_a_row
            if self._state.timeouts >= count:
                self.declare(
                    f"the model provider is not answering: {count} calls in a row timed out "
                    f"(last: {error.message})"
                )

    # -- the supervisor ----------------------------------------------------------------------
    async def _supervise(self) -> None:
        state = self._state
        while True:
            if self.outage.is_set():
                await self._recover()
                continue
            if state.in_transport == 0:
                await self._nap(None, lambda: state.in_transport > 0 or self.outage.is_set())
                continue
            quiet_since = max(state.last_answer, state.busy_since)
            due = quiet_since + self.policy.stall_after_s - time.monotonic()
            if due > 0:
                await self._nap(due, self.outage.is_set)
                continue
            silent = time.monotonic() - quiet_since
            answer, detail = await self._probe()
            if answer != "silent" or state.in_transport == 0:
                continue  # the provider answered the probe: slow, not gone
            waiting = state.in_transport
            self.declare(
                f"the model provider stopped answering: {waiting} call"
                f"{'s' if waiting != 1 else ''} waiting, no answer for {silent:.0f} s, and a "
                f"probe got none ({detail})"
            )

    async def _recover(self) -> None:
        probes = 0
        while self.outage.is_set():
            probes += 1
            await self._nap(self.policy.probe_wait(probes), lambda: not self.outage.is_set())
            if not self.outage.is_set():
                return
            answer, detail = await self._probe()
            if answer == "healthy":
                self.clear(f"probe {probes} succeeded")
                return
            if not self.outage.is_set():
                return  # cleared by the engine while the probe was out
            logger.info(
                "model provider still unavailable (probe %d: %s); next probe in %.1f s",
                probes,
                detail,
                self.policy.probe_wait(probes + 1),
            )

    async def _probe(self) -> tuple[ProbeAnswer, str]:
        timeout = self.policy.probe_timeout_s
        try:
            async with asyncio.timeout(timeout):
                await self._probe_call()
        except TimeoutError:
            self._stall_confirmed()
            return "silent", f"no answer within {timeout:g} s"
        except ProviderError as error:
            if error.status is None:
                self._stall_confirmed()
                return "silent", self._scrub(error.message)
            self._answered()
            return "answered", self._scrub(f"HTTP {error.status}: {error.message}")
        except Exception as error:  # a fault of ours: say so, and keep probing
            logger.exception("model bridge: the provider probe failed unexpectedly")
            return "silent", self._scrub(f"{type(error).__name__}: {error}")
        self._answered()
        return "healthy", "answered"

    def _stall_confirmed(self) -> None:
        """A probe got no answer: the provider is silent since its last answer to anyone."""
        state = self._state
        if state.stall_from is None:
            state.stall_from = state.last_answer

    async def _nap(self, seconds: float | None, done: Callable[[], bool]) -> None:
        """Sleep `seconds` (None: for ever) or until `done()` holds, rechecked on each wake."""
        loop = asyncio.get_running_loop()
        deadline = None if seconds is None else loop.time() + seconds
        while not done():
            self._wake.clear()
            try:
                async with asyncio.timeout_at(deadline):
                    await self._wake.wait()
            except TimeoutError:
                return
