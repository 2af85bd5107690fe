"""What the bridge keeps per rollout: every call (for the trajectory) and running usage.

    log = CallLog("openai/gpt-4o-mini", price=price_for("openai/gpt-4o-mini"))
    log.record(rollout_id="r1", ..., completion=payload)
    log.usage("r1").total_tokens, log.take_calls("r1")

Tokens come from the provider's `usage`; cost is priced here, from LiteLLM's map
(`osmosis.eval.model.pricing`), so every transport is accounted the same way.

A record is bounded by what its call added, not by the whole conversation: an agent resends
its history on every turn, so a record keeps only the messages after those of the rollout's
previous call (all of them when the conversation does not continue the previous one). The
rollout's trajectory holds the conversation once; the records hold each message once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from osmosis.eval.model.pricing import Price
from osmosis.eval.model.providers import Completion

__all__ = ["BridgeStats", "CallLog", "CallRecord", "Outcome", "Usage", "spent_payload"]


@dataclass(frozen=True)
class BridgeStats:
    """What the bridge turned away or could not give to an attempt, since it started.

    stats = bridge.stats()
    stats.refused_calls  # calls under a rollout id not dispatched, or finished: 403
    """

    refused_calls: int = 0
    """Calls refused (403) because their rollout id was not dispatched or had finished."""
    late_calls: int = 0
    """Calls the provider answered after their attempt was closed (not in any record)."""
    late_tokens: int = 0
    """The provider's tokens for those late calls."""
    late_cost_usd: float | None = None
    """Their cost; None when none had a known price."""
    throttled_calls: int = 0
    """Provider answers 429 or overloaded (503, 529) to this bridge's calls, retries included."""
    limit: int | None = None
    """The adaptive limit on calls in flight to the provider key now (shared by every bridge
    of the process on that key); None: the bridge runs without one."""


@dataclass(frozen=True)
class CallRecord:
    """One chat completion a rollout made through the bridge, as the trajectory needs it.

    record = bridge.take_calls(rollout_id)[0]
    record.response_message["content"], record.prompt_tokens, record.cost_usd
    """

    rollout_id: str
    started_at: datetime
    """When the bridge received the request (UTC)."""
    latency_ms: float
    """From receipt to the answer being ready, retries included."""
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None
    """From LiteLLM's price map; None when the model has no listed price or no usage came back."""
    model: str
    """The model that answered (as the provider names it), else the run's model path."""
    request_messages: list[Any]
    """The messages this call added, unchanged: on the rollout's first call all it sent; then
    those after the previous call's messages (all it sent when it did not continue them)."""
    response_message: dict[str, Any] | None
    """The assistant message that came back; None when the call failed."""
    status_code: int
    """What the bridge answered the rollout: 200, or the error status."""
    error: str | None = None
    """Why the call failed (secrets redacted); None on success."""
    attempts: int = 0
    """Provider calls made for it, retries included (0: refused before reaching one)."""
    request_params: Mapping[str, Any] = field(default_factory=dict)
    """The inference parameters that were forwarded (tools, temperature, …)."""

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Usage:
    """What one rollout's calls consumed: `bridge.usage(rollout_id).total_tokens`.

    `calls` counts every recorded call, failed ones included; `total_tokens` sums the
    provider's totals; `cost_usd` is None when no call had a known price.
    """

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cost_usd: float | None = None


@dataclass
class _Tally:
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cost_usd: float | None = None

    def add(self, record: CallRecord, total_tokens: int) -> None:
        self.calls += 1
        self.prompt_tokens += record.prompt_tokens
        self.completion_tokens += record.completion_tokens
        self.total_tokens += total_tokens
        if record.cost_usd is not None:
            self.cost_usd = (self.cost_usd or 0.0) + record.cost_usd

    def usage(self) -> Usage:
        return Usage(
            calls=self.calls,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            total_tokens=self.total_tokens,
            cost_usd=self.cost_usd,
        )


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class CallLog:
    """Calls and usage per rollout id; the bridge's event loop is its only writer.

    CallLog("hosted_vllm/qwen3").usage("never-seen")  # Usage(calls=0, ...)
    """

    def __init__(self, model_path: str, price: Price | None = None) -> None:
        self.model_path = model_path
        self.price = price
        """USD per token of the run's model; None: calls are recorded without a cost."""
        self._calls: dict[str, list[CallRecord]] = {}
        self._usage: dict[str, _Tally] = {}
        self._sent: dict[str, list[Any]] = {}  # each rollout's last messages, as sent
        self._late = _Tally()
        self._total = _Tally()  # every call's usage since the log began, forgotten ones too

    def record(
        self,
        *,
        rollout_id: str,
        started_at: datetime,
        latency_ms: float,
        messages: list[Any],
        params: Mapping[str, Any],
        status: int,
        completion: Mapping[str, Any] | None = None,
        error: str | None = None,
        attempts: int = 0,
    ) -> CallRecord:
        """Keep one call: `completion` is the provider's `chat.completion` on success."""
        message: dict[str, Any] | None = None
        prompt_tokens = completion_tokens = provider_total = 0
        cost: float | None = None
        model = self.model_path
        if completion is not None:
            choices = completion.get("choices")
            first = choices[0] if isinstance(choices, list) and choices else None
            if isinstance(first, dict) and isinstance(first.get("message"), dict):
                message = first["message"]
            if isinstance(completion.get("model"), str) and completion["model"]:
                model = completion["model"]
            prompt_tokens, completion_tokens, provider_total, cost = self._spent(completion)
        previous = self._sent.get(rollout_id)
        self._sent[rollout_id] = messages
        if previous is not None and messages[: len(previous)] == previous:
            messages = messages[len(previous) :]  # the history is in earlier records
        record = CallRecord(
            rollout_id=rollout_id,
            started_at=started_at,
            latency_ms=latency_ms,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cost_usd=cost,
            model=model,
            request_messages=messages,
            response_message=message,
            status_code=status,
            error=error,
            attempts=attempts,
            request_params=params,
        )
        self._calls.setdefault(rollout_id, []).append(record)
        tally = self._usage.get(rollout_id)
        if tally is None:
            tally = self._usage[rollout_id] = _Tally()
        # The provider's total when it gave one: it may count tokens the split does not.
        tally.add(record, provider_total or record.total_tokens)
        self._total.add(record, provider_total or record.total_tokens)
        return record

    def record_late(self, completion: Mapping[str, Any]) -> None:
        """Count a call answered after its rollout was closed: no record takes it, but the
        provider spent it (`late()`)."""
        prompt_tokens, completion_tokens, provider_total, cost = self._spent(completion)
        for tally in (self._late, self._total):
            tally.calls += 1
            tally.prompt_tokens += prompt_tokens
            tally.completion_tokens += completion_tokens
            tally.total_tokens += provider_total or prompt_tokens + completion_tokens
            if cost is not None:
                tally.cost_usd = (tally.cost_usd or 0.0) + cost

    def late(self) -> Usage:
        """What the calls counted by `record_late` consumed, together."""
        return self._late.usage()

    def total(self) -> Usage:
        """What every call recorded or counted late consumed since the log began (`forget`
        does not take it back): what the run's budget counts."""
        return self._total.usage()

    def _spent(self, completion: Mapping[str, Any]) -> tuple[int, int, int, float | None]:
        """(prompt, completion, provider's total, cost) of one `chat.completion`."""
        usage = completion.get("usage")
        if not isinstance(usage, dict):
            return 0, 0, 0, None
        prompt_tokens = _int(usage.get("prompt_tokens"))
        completion_tokens = _int(usage.get("completion_tokens"))
        details = usage.get("prompt_tokens_details")
        cached_tokens = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
        cost = (
            self.price.cost(
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                cached_tokens=cached_tokens,
            )
            if self.price is not None
            else None
        )
        return prompt_tokens, completion_tokens, _int(usage.get("total_tokens")), cost

    def take_calls(self, rollout_id: str) -> list[CallRecord]:
        """Remove and return the calls recorded for `rollout_id`, oldest first ([] if none)."""
        return self._calls.pop(rollout_id, [])

    def usage(self, rollout_id: str) -> Usage:
        """Tokens and cost of every call recorded for `rollout_id` (zeros if none)."""
        tally = self._usage.get(rollout_id)
        return Usage() if tally is None else tally.usage()

    def forget(self, rollout_id: str) -> None:
        """Drop the calls and usage kept for `rollout_id`."""
        self._calls.pop(rollout_id, None)
        self._usage.pop(rollout_id, None)
        self._sent.pop(rollout_id, None)


@dataclass(frozen=True)
class Outcome:
    """What the provider side produced for one request."""

    status: int
    completion: Completion | None = None
    error: str | None = None
    code: str | None = None
    attempts: int = 0
    released: bool = False
    """The engine forgot the rollout while this call waited: nothing is recorded."""
    replayed: bool = False
    """Answered from the run's record of calls: no provider call, no tokens spent."""


def spent_payload(outcome: Outcome) -> dict[str, Any] | None:
    """The completion a call's record counts: an answer from the run's record spent nothing,
    so its `usage` is left out (the rollout still receives it)."""
    if outcome.completion is None:
        return None
    payload = outcome.completion.payload
    if outcome.replayed:
        return {key: value for key, value in payload.items() if key != "usage"}
    return payload
