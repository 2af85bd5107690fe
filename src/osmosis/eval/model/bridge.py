"""The model bridge: the only way a rollout reaches the policy model.

One bridge serves one evaluation run, inside the engine's event loop, on loopback unless the
host binds it wider (`start(host=...)`) and advertises the URL other machines use
(`advertise_url`). Each attempt gets a rollout-scoped OpenAI base URL
(`bridge.rollout_url(rollout_id)`) and the run's bearer token (`bridge.token`); any
OpenAI-speaking client or agent framework works with them.
The bridge pins the run's model, holds the provider credentials, refuses credential and
transport overrides (`osmosis.eval.model.bridge_rules`), counts tokens and cost per rollout, records
every call for the trajectory, and retries provider faults (`osmosis.eval.model.retry`).

    async with ModelBridge(target=resolve_model("openai/gpt-4o-mini", env)) as bridge:
        url = bridge.open_rollout(rollout_id)       # give to the rollout with bridge.token
        ...
        bridge.close_rollout(rollout_id)             # its attempt is over: no more calls
        calls = bridge.take_calls(rollout_id)        # for the trajectory
        usage = bridge.usage(rollout_id)             # tokens and USD for the attempt record
        if bridge.outage.is_set():                   # pause dispatch, requeue the stuck
            bridge.stuck_rollouts()                   # rollouts, then forget them
            await bridge.wait_recovered(300)          # the bridge probes by itself

Route: `POST /v1/rollouts/{rollout_id}/chat/completions` (clients append `/chat/completions`
to the rollout URL). `stream=true` is emulated: the provider is called without streaming and
the finished completion is replayed as SSE (`osmosis.eval.model.bridge_wire`), with keep-alive
comments while a slow provider works.

Only what the engine dispatched is served: a rollout id is served from `open_rollout` until
`close_rollout` (or `forget`). A call under any other id, invented or finished, is answered 403
(`rollout_not_dispatched`) from its head alone: its body is read and dropped as it arrives,
nothing of it is kept, no provider is called, and `bridge.stats().refused_calls` counts it. So
every call that reaches the provider belongs to an attempt in flight and lands in that
attempt's tokens and cost; one its attempt no longer waits for (answered after
`close_rollout`) is counted in `stats()` as a late call instead of vanishing. Limits:
`max_request_bytes` per request body (413 naming the limit) and `max_tokens` for what a call
may ask (`max_tokens` / `max_completion_tokens` above it: 400 naming the cap; a call that asks
nothing gets the provider's default).

Provider outages (`osmosis.eval.model.bridge_outage`): `bridge.outage` is set, with
`bridge.outage_reason`, when a retryable fault (429, 5xx, no connection, timeout) outlasts the
`RetryPolicy`, when calls in a row time out, or when the provider stops answering altogether
(calls waiting, no answer for `OutagePolicy.stall_after_s`, and a probe unanswered too). The
engine then pauses dispatch instead of recording failures. While declared, every new call gets
503 at once and calls waiting between retries stop waiting; calls stuck inside the provider
stay until the engine forgets their rollout (`forget` releases them with a 503). The bridge
probes the provider with a one-token completion (backoff, capped) and clears the outage on
the first success; a stuck call that finally succeeds does not clear it, because one lucky
call says little about a provider that just stopped for a minute. `clear_outage()` is the
engine's override.

Adaptive concurrency (`osmosis.eval.model.bridge_limits`): every provider attempt takes a slot
from the process's AIMD limit for its provider key (429s cut it, answers grow it, up to
`max_in_flight`), shared with every other bridge of the process on that key (and, on the
platform, with every worker: `install_coordinator`). `rate_wait(rollout_id)` says how long
its calls waited on the rate limit unserved (for a slot, or for a retry after a 429): the
engine does not charge that to the attempt's deadline. Honest stalls:
`stalled(rollout_id)` tells the engine that an attempt past its deadline waited on a provider
that answered nobody meanwhile, so it goes back to pending instead of failing `timeout`.

Budgets (`osmosis.eval.model.bridge_budget`): with a `Budget`, each call is checked before
it is forwarded against what the run spent (`spent()` plus `spent_before`); once a limit is
reached the call is held unanswered, `budget_exhausted` is set (`budget_reason` says which
limit) and the host halts the run, whose `forget` lets the held call go with a 503.

Record and replay (`osmosis.eval.model.bridge_record`): with a `CallRecorder`, every answered
call is appended to the run's record under its attempt key (row, run index, call sequence;
the host assigns each rollout id its attempt as it is admitted: `bridge.recorder.assign`).
In `use` mode a call whose key and request are recorded is answered from the record, in
`replay` mode only from it: a miss is answered 404 `cache_miss` and never reaches the
provider. Answers from the record cost no tokens, no budget and no provider call.

The probe is a one-token chat completion, not `GET /models`: it goes through the very path
rollouts use (transport, credentials, model name, LiteLLM translation), it is the one request
every provider supports, and an inference server whose engine is wedged often still lists
its models. It costs a few prompt tokens per probe, at most one every `probe_max_s`.

Served by `osmosis.eval.model.bridge_http` (the httptools parser, one bare ASGI callable, each
answer written in one system call): one route needs no framework, and the bridge's own
overhead stays far below the provider transport's.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

import pydantic_core

from osmosis.eval.model.bridge_address import BridgeAddress, advertised_root
from osmosis.eval.model.bridge_budget import Budget, BudgetGuard, Spend
from osmosis.eval.model.bridge_calls import (
    BridgeStats,
    CallLog,
    CallRecord,
    Outcome,
    Usage,
    spent_payload,
)
from osmosis.eval.model.bridge_http import AsgiServer, Refusal
from osmosis.eval.model.bridge_limits import (
    OVERLOAD_STATUSES,
    RateWaits,
    limit_key,
    shared_limit,
)
from osmosis.eval.model.bridge_observer import BridgeObserver
from osmosis.eval.model.bridge_outage import OutageDeclared, OutagePolicy, ProviderWatch
from osmosis.eval.model.bridge_record import CACHE_MISS, CallRecorder
from osmosis.eval.model.bridge_rules import RequestRejected, inference_params
from osmosis.eval.model.bridge_wire import (
    HEARTBEAT,
    JSON_HEADERS,
    ROUTE_PREFIX,
    ROUTE_SUFFIX,
    Receive,
    Send,
    declared_length,
    openai_error,
    read_body,
    refuse,
    rollout_of,
    send_bytes,
    send_error,
    sse_error,
    sse_stream,
    too_large,
)
from osmosis.eval.model.pricing import Price, price_for
from osmosis.eval.model.providers import (
    Completion,
    ModelTarget,
    ProviderError,
    Transport,
    open_transport,
)
from osmosis.eval.model.retry import RetriesExhausted, RetryPolicy, call_with_retries

__all__ = [
    "DEFAULT_MAX_REQUEST_BYTES",
    "DEFAULT_MAX_TOKENS",
    "BridgeStats",
    "Budget",
    "CallRecord",
    "ModelBridge",
    "OutagePolicy",
    "Spend",
    "Usage",
]

DEFAULT_MAX_REQUEST_BYTES = 32 * 1024 * 1024
"""The largest request body a call may send (long contexts with images fit)."""
DEFAULT_MAX_TOKENS = 131_072
"""The most tokens a call may ask for (`max_tokens`, `max_completion_tokens`): above every
current model's output limit, so only an operator's lower cap refuses honest calls."""

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
_NOT_DISPATCHED = "rollout_not_dispatched"
_REDACTED = "[REDACTED]"
_GRACEFUL_STOP = 3
_UNAVAILABLE = "provider_unavailable"
_BUDGET_EXHAUSTED = "budget_exhausted"
_PROBE_MESSAGES = [{"role": "user", "content": "hi"}]
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


class ModelBridge:
    """A rollout-scoped OpenAI endpoint in front of the run's model.

    Args:
        target: the run's model (`resolve_model(...)` or a `ModelTarget`).
        token: the bearer token rollouts must send; a fresh random one by default.
        retry: how provider faults are retried before the bridge gives up (and declares an
            outage).
        redact: applied to every error text the bridge writes or records, after the
            target's own credentials are blanked.
        heartbeat: seconds between keep-alive comments on a stream still waiting for the
            provider.
        outage_policy: when the provider counts as down and how it is probed back
            (`OutagePolicy`; see the module doc).
        advertise_url: the root URL rollouts use to reach the bridge when that is not the
            address it listens on (another machine, a proxy): `http://10.0.0.5:8321`. A
            trailing `/v1` is accepted; without a port, the bound port is used.
        max_tokens: the most tokens one call may ask for (`max_tokens` or
            `max_completion_tokens`); above it the call is refused 400 naming the cap. None:
            no cap.
        max_request_bytes: the largest request body; a larger one is refused 413 naming it.
        budget: the run's limits on tokens, cost and model calls (`bridge_budget`): once one
            is reached, no call is forwarded again and `budget_exhausted` is set.
        spent_before: what the run's earlier invocations spent, counted against `budget`.
        price: the run's model price, instead of LiteLLM's table (a model it does not list).
        recorder: the run's record of calls (`bridge_record`): every answer is appended to it,
            and in `use` / `replay` mode calls are answered from it. None: nothing recorded.
        max_in_flight: the run's bound on the adaptive limit (`bridge_limits`) of calls in flight.
        adaptive: False: no adaptive limit, only the caller's own concurrency.

        bridge = ModelBridge(target=target, retry=RetryPolicy(max_attempts=4))
        await bridge.start()
        ...
        await bridge.stop()
    """

    def __init__(
        self,
        *,
        target: ModelTarget,
        token: str | None = None,
        retry: RetryPolicy = RetryPolicy(),  # noqa: B008 - frozen, so sharing it is safe
        redact: Callable[[str], str] | None = None,
        heartbeat: float = 10.0,
        outage_policy: OutagePolicy = OutagePolicy(),  # noqa: B008 - frozen, like retry
        advertise_url: str | None = None,
        max_tokens: int | None = DEFAULT_MAX_TOKENS,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        budget: Budget = Budget(),  # noqa: B008 - frozen, like retry
        spent_before: Spend = Spend(),  # noqa: B008 - frozen, like retry
        price: Price | None = None,
        recorder: CallRecorder | None = None,
        max_in_flight: int | None = None,
        adaptive: bool = True,
    ) -> None:
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        if max_request_bytes < 1:
            raise ValueError(f"max_request_bytes must be at least 1, got {max_request_bytes}")
        self.target = target
        self.max_tokens = max_tokens
        self.max_request_bytes = max_request_bytes
        self.token = token if token is not None else secrets.token_hex(16)
        if not self.token:
            raise ValueError("the bridge token must not be empty")
        self.retry = retry
        self.heartbeat = heartbeat
        self.advertise_url = advertise_url
        if advertise_url:
            advertised_root(advertise_url)  # a bad URL is refused here, before anything starts
        self._watch = ProviderWatch(outage_policy, self._probe, scrub=self.scrub)
        self.outage = self._watch.outage
        """Set while the provider is declared down; see the module doc."""
        self._redact = redact
        self._token_bytes = self.token.encode()
        self._secrets = tuple(s for s in (*target.secrets(), self.token) if s)
        self._log = CallLog(target.model_path)
        self._transport: Transport | None = None
        self._server: AsgiServer | None = None
        self._base_url: str | None = None
        self._bound_url: str | None = None
        self._pending: set[asyncio.Task[Outcome]] = set()
        self._open: set[str] = set()  # rollout ids dispatched and not finished: served
        self._refused = 0
        self._price = price
        self._budget = BudgetGuard(budget, spent_before)
        self.budget_exhausted = self._budget.exhausted
        """Set once a limit of the run's budget is reached: calls are held from then on."""
        self._forwarded = 0  # calls admitted past the budget to the provider
        self.recorder = recorder
        """The run's record of calls; None: calls are neither recorded nor replayed."""
        self.observer: BridgeObserver | None = None  # metrics, traces (bridge_observer)
        self._limit = shared_limit(limit_key(target), ceiling=max_in_flight) if adaptive else None
        self._throttled = 0  # this bridge's calls answered 429 / overloaded
        self._rate_waits = RateWaits()  # calls waiting on the rate limit, unserved

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(
        self, host: str = "127.0.0.1", port: int = 0, *, address: BridgeAddress | None = None
    ) -> ModelBridge:
        """Open the provider transport and listen on `host:port` (0: a free port), or on
        `address`, bound ahead (`BridgeAddress.listen`: a host that starts the rollout servers
        meanwhile; it is closed if the bridge cannot start).

        Returns once connections are accepted; `base_url` then holds the real port. A host
        beyond loopback (`0.0.0.0`, a LAN address) is allowed, with a warning: the run's token
        guards every call, but the traffic is plain HTTP.
        """
        if self._server is not None:
            raise RuntimeError("the model bridge is already running")
        if address is None:
            address = BridgeAddress.listen(host, port, advertise_url=self.advertise_url)
        try:
            # Off the event loop: the price map is a 3.5 MB JSON file, and LiteLLM's import
            # (for targets that need it) takes seconds.
            price = self._price or await asyncio.to_thread(price_for, self.target.model_path)
            self._log.price = price
            self._budget.admit(self.spent())  # a resumed run may have spent its budget already
            self._transport = await asyncio.to_thread(open_transport, self.target)
        except BaseException:
            address.close()
            raise
        if self.observer is not None:
            self._transport = self.observer.wrap_transport(self._transport)
        # Agents pause between turns (tools, graders): idle connections stay open 75 s.
        server = AsgiServer(
            self._asgi,
            keep_alive_sec=75.0,
            graceful_sec=_GRACEFUL_STOP,
            max_body=self.max_request_bytes,
            error_body=openai_error,
            screen=self._screen,
        )
        try:
            await server.start(address.sock)
        except BaseException:
            address.close()
            await self._transport.aclose()
            self._transport = None
            raise
        self._server = server
        self._bound_url = address.bound_url
        self._base_url = address.base_url
        self._watch.start()
        return self

    async def stop(self) -> None:
        """Stop listening (in-flight calls get a few seconds to finish) and close the
        provider connections. Recorded calls and usage stay readable."""
        server, self._server = self._server, None
        await self._watch.stop()
        self._budget.release_all()
        if server is not None:
            await server.stop()
        for task in list(self._pending):
            task.cancel()
        if self.recorder is not None:
            self.recorder.close()  # flushed: a halt or Ctrl-C keeps every answered call
        transport, self._transport = self._transport, None
        if transport is not None:
            await transport.aclose()

    async def __aenter__(self) -> ModelBridge:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- addresses ---------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        """The OpenAI base URL rollouts use, once started: `http://127.0.0.1:PORT/v1`, or the
        advertised root followed by `/v1`."""
        if self._base_url is None:
            raise RuntimeError("the model bridge has not started; await bridge.start()")
        return self._base_url

    @property
    def bound_url(self) -> str:
        """Where the bridge really listens, once started: `http://HOST:PORT` (no `/v1`)."""
        if self._bound_url is None:
            raise RuntimeError("the model bridge has not started; await bridge.start()")
        return self._bound_url

    def rollout_url(self, rollout_id: str) -> str:
        """The OpenAI base URL one rollout uses: `…/v1/rollouts/{rollout_id}` (served only
        while the rollout is open: `open_rollout`)."""
        if not rollout_id or "/" in rollout_id:
            raise ValueError(f"invalid rollout id {rollout_id!r}")
        return f"{self.base_url}/rollouts/{rollout_id}"

    # -- what is served ----------------------------------------------------------------------
    def open_rollout(self, rollout_id: str) -> str:
        """Serve calls under `rollout_id` from now on (the engine dispatched it); returns its
        URL, as `rollout_url` does.

            url = bridge.open_rollout(rollout_id)  # the rollout's chat_completions_url
        """
        url = self.rollout_url(rollout_id)
        self._open.add(rollout_id)
        return url

    def close_rollout(self, rollout_id: str) -> None:
        """Serve no more calls under `rollout_id` (its attempt is over): new ones get 403.
        What is recorded stays until `take_calls` / `forget`; a call still waiting for the
        provider is answered, and counted as late in `stats()`."""
        self._open.discard(rollout_id)

    def stats(self) -> BridgeStats:
        """Calls refused and late calls since the bridge started (see `BridgeStats`)."""
        late = self._log.late()
        return BridgeStats(
            refused_calls=self._refused,
            late_calls=late.calls,
            late_tokens=late.total_tokens,
            late_cost_usd=late.cost_usd,
            throttled_calls=self._throttled,
            limit=self._limit.limit if self._limit is not None else None,
        )

    # -- accounting --------------------------------------------------------------------------
    def take_calls(self, rollout_id: str) -> list[CallRecord]:
        """Remove and return the calls recorded for `rollout_id`, oldest first ([] if none)."""
        return self._log.take_calls(rollout_id)

    def usage(self, rollout_id: str) -> Usage:
        """Tokens and cost of every call `rollout_id` made so far (zeros if none)."""
        return self._log.usage(rollout_id)

    def forget(self, rollout_id: str) -> None:
        """Drop everything kept for `rollout_id` (call it once the attempt is recorded, so
        memory follows concurrency rather than the number of attempts).

        Calls still waiting for the provider on its behalf are released: they answer 503 and
        nothing more is recorded for it (how the engine frees attempts stuck in an outage).
        """
        self._open.discard(rollout_id)
        self._watch.release(rollout_id)
        self._rate_waits.forget(rollout_id)
        self._budget.release(rollout_id)
        self._log.forget(rollout_id)
        if self.recorder is not None:
            self.recorder.forget(rollout_id)

    # -- the budget ----------------------------------------------------------------------------
    @property
    def price(self) -> Price | None:
        """USD per token of the run's model, once started; None: calls have no cost."""
        return self._log.price

    @property
    def budget_reason(self) -> str | None:
        """`budget: max_tokens_total 1,000 reached (1,024 used)` once `budget_exhausted`."""
        return self._budget.reason

    def spent(self) -> Spend:
        """What this bridge's calls spent at the provider (earlier invocations not included):
        calls forwarded, and the tokens and cost of every answer, late ones included."""
        total = self._log.total()
        return Spend(
            calls=self._forwarded, tokens=total.total_tokens, cost_usd=total.cost_usd or 0.0
        )

    # -- outages -------------------------------------------------------------------------------
    @property
    def outage_reason(self) -> str | None:
        """Why the provider is declared down (secrets blanked); None while it is not."""
        return self._watch.reason

    def stuck_rollouts(self) -> set[str]:
        """Rollout ids with a call inside the provider transport right now.

        During an outage these are the attempts waiting on a provider that stopped answering.
        """
        return self._watch.stuck_rollouts()

    async def wait_recovered(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109
        """Wait until no outage is declared: True at once when none is, or when a probe
        clears it; False after `timeout` seconds (None: wait for ever).

            if not await bridge.wait_recovered(300): halt("provider still down")
        """
        return await self._watch.wait_recovered(timeout)

    async def stalled(self, rollout_id: str) -> bool:
        """Whether `rollout_id`'s outstanding call waits on a provider that stopped answering
        everyone (`ProviderWatch.stalled`): its attempt goes back to pending, not `timeout`."""
        return await self._watch.stalled(rollout_id)

    def stall_time(self, rollout_id: str) -> float:
        """Seconds `rollout_id`'s calls waited on the provider inside stalls a probe confirmed
        (`ProviderWatch.stall_time`): an attempt that timed out only because of them is the
        provider's, not a `timeout`."""
        return self._watch.stall_time(rollout_id)

    def rate_wait(self, rollout_id: str) -> tuple[float, bool]:
        """(seconds `rollout_id`'s calls waited on the provider's rate limit unserved, waits
        under way included; whether one waits now): for a slot of the adaptive limit, or for
        a retry after a 429 / overload answer (`RateWaits`). An attempt whose deadline passed
        meanwhile is the rate limit's, not the attempt's."""
        return self._rate_waits.wait(rollout_id)

    def clear_outage(self) -> None:
        """End a declared outage now, without waiting for a probe (the engine's override)."""
        self._watch.clear()

    # -- errors and secrets -------------------------------------------------------------------
    def scrub(self, text: str) -> str:
        """`text` with the target's credentials and the bridge token blanked, then `redact`."""
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, _REDACTED)
        return self._redact(text) if self._redact is not None else text

    def _log_retry(self, error: ProviderError, attempt: int, wait: float) -> None:
        what = f"HTTP {error.status}" if error.status is not None else error.cause
        logger.info(
            "model provider answered %s (attempt %d); retrying in %.2f s: %s",
            what,
            attempt,
            wait,
            self.scrub(error.message),
        )

    # -- calling the provider ----------------------------------------------------------------
    async def _probe(self) -> None:
        """One cheap completion through the rollouts' transport (raises `ProviderError`)."""
        transport = self._transport
        if transport is None:
            raise ProviderError("the model bridge is stopping", cause="unknown")
        await transport.complete(
            {"model": self.target.model, "messages": _PROBE_MESSAGES, "max_tokens": 1}
        )

    async def _call_provider(self, rollout_id: str, request: Mapping[str, Any]) -> Outcome:
        transport = self._transport
        if transport is None:
            return Outcome(503, error="the model bridge is stopping", code="bridge_stopping")
        watch = self._watch
        if watch.outage.is_set():
            # Fail fast: the engine requeues the attempt, and no call piles onto a provider
            # that is down.
            return Outcome(503, error=self._unavailable(), code=_UNAVAILABLE)
        call = watch.enter(rollout_id)
        attempts = 0
        limit = self._limit
        waits = self._rate_waits
        waiting = waits.begin(rollout_id)

        def send() -> Awaitable[Completion]:
            return watch.through(call, transport.complete(request))

        async def attempt() -> Completion:
            nonlocal attempts
            attempts += 1

            def granted() -> Awaitable[Completion]:
                waits.sent(rollout_id, waiting)
                return send()

            try:
                if limit is None:
                    return await granted()
                return await limit.call(granted, owner=self, priority=waits.first(rollout_id))
            except ProviderError as error:
                if error.status in OVERLOAD_STATUSES:
                    self._throttled += 1
                    waits.throttled(rollout_id, waiting)  # its retry waits on the rate limit
                raise

        try:
            completion = await call_with_retries(
                attempt, self.retry, sleep=watch.retry_sleep, on_retry=self._log_retry
            )
        except asyncio.CancelledError:
            # `forget` cancelled us: the engine gave this rollout up. Any other cancellation
            # (the bridge stopping) goes on.
            if call.released and call.task is not None and call.task.uncancel() == 0:
                message = "the run gave this rollout up while the model provider was unavailable"
                return Outcome(
                    503, error=message, code=_UNAVAILABLE, attempts=attempts, released=True
                )
            raise
        except OutageDeclared:
            return Outcome(503, error=self._unavailable(), code=_UNAVAILABLE, attempts=attempts)
        except RetriesExhausted as exhausted:
            watch.declare(f"the model provider is unavailable: {exhausted}")
            return Outcome(503, error=self._unavailable(), code=_UNAVAILABLE, attempts=attempts)
        except ProviderError as error:
            status = error.status if error.status is not None and error.status >= 400 else 502
            return Outcome(
                status, error=self.scrub(error.message), code=error.code, attempts=attempts
            )
        except Exception as error:  # a fault of ours, not the provider's: say so, keep serving
            logger.exception("model bridge: unexpected error calling the provider")
            message = self.scrub(f"internal bridge error: {type(error).__name__}: {error}")
            return Outcome(500, error=message, code="bridge_error", attempts=attempts)
        finally:
            watch.leave(call)
            waits.end(rollout_id, waiting, keep=rollout_id in self._open)
        return Outcome(200, completion=completion, attempts=attempts)

    def _unavailable(self) -> str:
        return self._watch.reason or "the model provider is unavailable"

    def _record(
        self,
        rollout_id: str,
        started_at: datetime,
        began: float,
        messages: list[Any],
        params: Mapping[str, Any],
        outcome: Outcome,
    ) -> None:
        call = self._log.record(
            rollout_id=rollout_id,
            started_at=started_at,
            latency_ms=(time.perf_counter() - began) * 1000,
            messages=messages,
            params=params,
            status=outcome.status,
            completion=spent_payload(outcome),
            error=outcome.error,
            attempts=outcome.attempts,
        )
        if self.observer is not None:
            self.observer.model_call(call)

    async def _serve_call(
        self,
        rollout_id: str,
        started_at: datetime,
        began: float,
        messages: list[Any],
        params: dict[str, Any],
    ) -> Outcome:
        # The run's model, whatever the client named: the bridge pins it.
        request = {**params, "model": self.target.model, "messages": messages}
        recorder = self.recorder
        if recorder is not None:
            return await self._recorded_call(
                recorder, rollout_id, started_at, began, messages, params, request
            )
        return await self._forward(rollout_id, started_at, began, messages, params, request)

    async def _recorded_call(
        self,
        recorder: CallRecorder,
        rollout_id: str,
        started_at: datetime,
        began: float,
        messages: list[Any],
        params: dict[str, Any],
        request: dict[str, Any],
    ) -> Outcome:
        """A call with the run's record: answered from it when the cache mode says so,
        else forwarded; what the provider answers is appended to it."""
        key = recorder.next_key(rollout_id)
        parts = {**params, "messages": messages}
        prepared = None  # `off`: prepared once the answer is out (`keep_soon`)
        if recorder.mode != "off":
            prepared = recorder.prepare(parts)
            answer = recorder.lookup(key, prepared.digest)
            if isinstance(answer, dict):
                outcome = Outcome(200, completion=Completion(answer), replayed=True)
                if key is not None:
                    recorder.keep(key, prepared, answer, source="record")
                self._record(rollout_id, started_at, began, messages, params, outcome)
                return outcome
            if recorder.mode == "replay":
                message = (
                    f"{CACHE_MISS}: {answer.reason}; the run replays model answers from its "
                    "record only, and the provider was not called"
                )
                outcome = Outcome(404, error=message, code=CACHE_MISS)
                self._record(rollout_id, started_at, began, messages, params, outcome)
                return outcome
        outcome = await self._forward(rollout_id, started_at, began, messages, params, request)
        if key is not None and outcome.completion is not None and not outcome.released:
            recorder.keep_soon(key, parts, outcome.completion.payload, prepared=prepared)
        return outcome

    async def _forward(
        self,
        rollout_id: str,
        started_at: datetime,
        began: float,
        messages: list[Any],
        params: dict[str, Any],
        request: dict[str, Any],
    ) -> Outcome:
        """Forward one call to the provider (past the budget) and record it for its attempt."""
        budget = self._budget
        # With no limit set, nothing to weigh: `spent()` sums the whole log (~2 us a call).
        if budget.budget.limited and not budget.admit(self.spent()):
            # Held, not answered: an answer the rollout could fail on would record its attempt
            # failed. The run halts on `budget_exhausted`; `forget` lets the call go.
            await budget.hold(rollout_id)
            reason = budget.reason or "the run's budget is spent"
            return Outcome(503, error=reason, code=_BUDGET_EXHAUSTED, released=True)
        self._forwarded += 1
        outcome = await self._call_provider(rollout_id, request)
        if outcome.attempts == 0:
            self._forwarded -= 1  # refused before reaching the provider (an outage, stopping)
        if outcome.released:  # a forgotten rollout keeps nothing
            return outcome
        if rollout_id not in self._open:
            # Its attempt was closed while the provider worked: no record will take this
            # call any more, so the run's stats count what the provider spent on it.
            if outcome.completion is not None:
                self._log.record_late(outcome.completion.payload)
            return outcome
        self._record(rollout_id, started_at, began, messages, params, outcome)
        return outcome

    # -- HTTP ----------------------------------------------------------------------------------
    def _screen(self, method: str, path: str, headers: list[tuple[bytes, bytes]]) -> Refusal | None:
        """What is refused from a request's head alone, before its body is read (the server
        drops a refused body as it arrives)."""
        rollout_id = rollout_of(path)
        if rollout_id is None:
            return refuse(404, f"no route for {path}; POST {ROUTE_PREFIX}{{id}}{ROUTE_SUFFIX}")
        if method != "POST":
            return refuse(405, f"use POST {path}")
        if not self._authorized(headers):
            return refuse(
                401,
                "missing or invalid bearer token for the evaluation bridge",
                code="invalid_api_key",
                headers=((b"www-authenticate", b"Bearer"),),
            )
        if rollout_id not in self._open:
            return self._not_dispatched(rollout_id)
        if declared_length(headers) > self.max_request_bytes:
            return refuse(413, too_large(self.max_request_bytes))
        return None

    def _not_dispatched(self, rollout_id: str) -> Refusal:
        self._refused += 1
        return refuse(
            403,
            f"rollout {rollout_id} is not one this run dispatched, or it has finished: the "
            "bridge serves only the run's attempts in flight",
            code=_NOT_DISPATCHED,
        )

    async def _asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The server screened the route, method, token and rollout id (`_screen`) from the
        # head; only the rollout may have finished while its body arrived.
        if scope["type"] != "http":
            return
        rollout_id = rollout_of(scope["path"]) or ""
        if rollout_id not in self._open:
            refusal = self._not_dispatched(rollout_id)
            await send_bytes(send, refusal.status, refusal.body, list(refusal.headers))
            return
        body = await read_body(receive, self.max_request_bytes)
        if body is None:
            await send_error(send, 413, too_large(self.max_request_bytes))
            return
        await self._chat(rollout_id, body, send)

    def _authorized(self, headers: list[tuple[bytes, bytes]]) -> bool:
        for name, value in headers:
            if name == b"authorization":
                scheme, _, credentials = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(
                    credentials.strip(), self._token_bytes
                )
        return False

    async def _chat(self, rollout_id: str, raw: bytes, send: Send) -> None:
        started_at = datetime.now(UTC)
        began = time.perf_counter()
        try:
            body = pydantic_core.from_json(raw)  # half of json.loads's time
        except ValueError:
            body = None
        if not isinstance(body, dict):
            await send_error(send, 400, "the request body must be a JSON object")
            return
        messages = body.get("messages")
        try:
            params = inference_params(body, max_tokens=self.max_tokens)
        except RequestRejected as rejected:
            outcome = Outcome(400, error=rejected.message, code="invalid_request")
            kept = messages if isinstance(messages, list) else []
            self._record(rollout_id, started_at, began, kept, {}, outcome)
            await send_error(send, 400, rejected.message, param=rejected.param)
            return
        assert isinstance(messages, list)  # inference_params checked it
        if body.get("stream") is True:
            options = body.get("stream_options")
            include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
            call = self._serve_call(rollout_id, started_at, began, messages, params)
            await self._stream(call, include_usage, send)
            return
        outcome = await self._serve_call(rollout_id, started_at, began, messages, params)
        completion = outcome.completion
        if completion is None:
            await send_error(send, outcome.status, outcome.error or "", code=outcome.code)
            return
        payload = completion.raw
        if payload is None:
            payload = pydantic_core.to_json(completion.payload)
        await send_bytes(send, 200, payload, JSON_HEADERS)

    async def _stream(self, call: Awaitable[Outcome], include_usage: bool, send: Send) -> None:
        # The provider call runs as its own task so that it finishes, and is recorded, even
        # if this client goes away mid-stream.
        task = asyncio.ensure_future(call)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        done, _ = await asyncio.wait({task}, timeout=self.heartbeat)
        if done:
            # Answered before the first heartbeat: errors keep their real HTTP status.
            outcome = task.result()
            if outcome.completion is None:
                await send_error(send, outcome.status, outcome.error or "", code=outcome.code)
            else:
                body = sse_stream(outcome.completion.payload, include_usage=include_usage)
                await send_bytes(send, 200, body, _SSE_HEADERS)
            return
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        while not done:
            await send({"type": "http.response.body", "body": HEARTBEAT, "more_body": True})
            done, _ = await asyncio.wait({task}, timeout=self.heartbeat)
        outcome = task.result()
        if outcome.completion is None:
            tail = sse_error(outcome.status, outcome.error or "", code=outcome.code)
        else:
            tail = sse_stream(outcome.completion.payload, include_usage=include_usage)
        await send({"type": "http.response.body", "body": tail, "more_body": False})
