"""The ambient per-rollout context: where the policy is, and where the sample comes from.

The rollout server opens one `RolloutContext` around each rollout; user code reaches it with
`get_rollout_context()` (or, more simply, through `ctx.chat(...)` on its workflow context).
"""

from __future__ import annotations

import copy
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from contextvars import ContextVar, Token
from dataclasses import dataclass, field

from osmosis.rollout.sample import RolloutSample
from osmosis.rollout.types import Message, Messages, RolloutStatus

_current: ContextVar[RolloutContext | None] = ContextVar("osmosis_rollout_context", default=None)


class SampleSource(ABC):
    """Supplies the sample when a workflow's `run()` returns None (e.g. an agent framework
    that keeps its own memory). One source per rollout."""

    @abstractmethod
    async def get_sample(self) -> RolloutSample:
        """The rollout's message history as a sample."""

    def get_preview(self, max_messages: int) -> Messages | None:
        """The most recent messages, for live previews; None when unsupported."""
        return None


@dataclass(frozen=True)
class PolicyCall:
    """One exchange with the policy, as recorded for the sample and the trajectory."""

    request_messages: Messages
    response_message: Message
    model: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_ms: float | None = None


class ConversationRecorder(SampleSource):
    """Keeps every policy call of a rollout; its sample is the latest conversation.

    The policy helpers record into it, so a workflow that returns None still yields the
    messages it exchanged.
    """

    def __init__(self) -> None:
        self.calls: list[PolicyCall] = []

    def record(self, call: PolicyCall) -> None:
        self.calls.append(call)

    @property
    def conversation(self) -> Messages:
        if not self.calls:
            return []
        last = self.calls[-1]
        return [*copy.deepcopy(last.request_messages), copy.deepcopy(last.response_message)]

    async def get_sample(self) -> RolloutSample:
        return RolloutSample(messages=self.conversation)

    def get_preview(self, max_messages: int) -> Messages | None:
        return self.conversation[-max_messages:]


@dataclass
class RolloutContext:
    """Per-rollout facts, ambient for the duration of one rollout.

    with RolloutContext(chat_completions_url=url, api_key=key, rollout_id="r1"):
        ...  # get_rollout_context() returns it here
    """

    chat_completions_url: str | None = None
    """Rollout-scoped OpenAI-compatible base URL; clients append `/chat/completions`."""
    api_key: str | None = None
    """Bearer token for that URL."""
    rollout_id: str | None = None
    """The controller's id for this attempt."""
    sample_source: SampleSource | None = None
    """Where the sample comes from when `run()` returns None; see `set_sample_source`."""
    process_id: str | None = None
    """Identity of the rollout server process."""
    on_status: Callable[[RolloutStatus], None] | None = None
    """Called by the backend when the rollout starts running or grading."""
    recorder: ConversationRecorder = field(default_factory=ConversationRecorder)
    """Every policy call made through the osmosis helpers."""
    environ: Mapping[str, str] | None = None
    """Where empty fields are filled from; `os.environ` when None."""
    _tokens: list[Token[RolloutContext | None]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        env = os.environ if self.environ is None else self.environ
        self.chat_completions_url = self.chat_completions_url or env.get(
            "OSMOSIS_CHAT_COMPLETIONS_URL"
        )
        self.api_key = self.api_key or env.get("OSMOSIS_API_KEY")
        self.rollout_id = self.rollout_id or env.get("OSMOSIS_ROLLOUT_ID")

    def __enter__(self) -> RolloutContext:
        self._tokens.append(_current.set(self))
        return self

    def __exit__(self, *exc: object) -> None:
        _current.reset(self._tokens.pop())

    def set_sample_source(self, source: SampleSource) -> None:
        """Register the one source of this rollout's sample; a second call raises."""
        if self.sample_source is not None and self.sample_source is not source:
            raise RuntimeError("a sample source is already registered for this rollout")
        self.sample_source = source

    def set_status(self, status: RolloutStatus) -> None:
        if self.on_status is not None:
            self.on_status(status)

    async def get_sample(self) -> RolloutSample | None:
        """The sample of a workflow that returned None: the registered source, else the
        recorded conversation, else None (no sample; grading it then fails)."""
        if self.sample_source is not None:
            return await self.sample_source.get_sample()
        if self.recorder.calls:
            return await self.recorder.get_sample()
        return None


def get_rollout_context() -> RolloutContext | None:
    """The context of the rollout running in this task, or None outside a rollout."""
    return _current.get()


def require_rollout_context() -> RolloutContext:
    """Like `get_rollout_context`, but explains how to fix a missing context."""
    ctx = _current.get()
    if ctx is None:
        ctx = RolloutContext()
        if ctx.chat_completions_url is None:
            raise RuntimeError(
                "no rollout context: call the policy from inside AgentWorkflow.run(), or set "
                "OSMOSIS_CHAT_COMPLETIONS_URL and OSMOSIS_API_KEY"
            )
    return ctx
