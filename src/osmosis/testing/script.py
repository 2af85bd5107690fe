"""Scripting the fake model: rules that decide the answer before its built-in behaviour does.

A rule matches a request (by substring, regex or predicate) and responds with a `Reply`, a
`Fail` or plain text. Rules are tried in order; the first match answers. A callable responder
may return None to pass the request on to the next rule. Requests no rule answers get the
built-in behaviour (tool call, arithmetic, echo).

    judge = Rule(contains="Grade the answer", respond='{"score": 1.0}')
    flaky = Rule(contains="flaky", respond=Fail(status=503), times=2)  # then answer normally
    with FakeModelServer(script=[judge, flaky]) as server: ...

A mapping is shorthand for substring rules: `script={"Grade the answer": '{"score": 1.0}'}`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeAlias


def message_text(message: Mapping[str, Any]) -> str:
    """The text of a chat message: its string content, or its text parts joined by newlines."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, Mapping) and part.get("type") == "text"
        )
    return ""


@dataclass(frozen=True)
class ChatRequest:
    """A chat completion request as the fake model received it.

    request = ChatRequest({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert request.last_user_text == "hi"
    """

    body: Mapping[str, Any]
    """The decoded JSON body, unchanged."""
    path: str = "/v1/chat/completions"
    """The URL path it was posted to (any prefix ending in /chat/completions)."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """Request headers, names in lower case."""

    @property
    def model(self) -> str:
        """The requested model name (echoed back in the response)."""
        return str(self.body.get("model") or "")

    @property
    def messages(self) -> list[Mapping[str, Any]]:
        """The conversation, oldest first."""
        messages = self.body.get("messages")
        return [m for m in messages if isinstance(m, Mapping)] if isinstance(messages, list) else []

    @property
    def tools(self) -> list[Mapping[str, Any]]:
        """The tools offered, as sent."""
        tools = self.body.get("tools")
        return [t for t in tools if isinstance(t, Mapping)] if isinstance(tools, list) else []

    @property
    def stream(self) -> bool:
        """Whether the client asked for server-sent events."""
        return bool(self.body.get("stream"))

    @property
    def last_message(self) -> Mapping[str, Any]:
        """The newest message ({} when there are none)."""
        messages = self.messages
        return messages[-1] if messages else {}

    @cached_property
    def last_user_text(self) -> str:
        """The text of the newest user message: "the prompt"."""
        for message in reversed(self.messages):
            if message.get("role") == "user":
                return message_text(message)
        return ""

    @cached_property
    def text(self) -> str:
        """The text of every message, joined by newlines; what `Rule.contains` searches."""
        return "\n".join(message_text(message) for message in self.messages)


@dataclass(frozen=True)
class ToolCall:
    """A tool call the fake model makes: `ToolCall("add", {"a": 1, "b": 2})`."""

    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)
    """A mapping (sent as JSON) or a string sent verbatim, e.g. deliberately invalid JSON."""


@dataclass(frozen=True)
class Reply:
    """An assistant message: text, tool calls, or both.

    Reply("391")
    Reply(tool_calls=[ToolCall("multiply", {"a": 17, "b": 23})])
    """

    content: str | None = None
    tool_calls: Sequence[ToolCall] = ()
    finish_reason: str | None = None
    """Defaults to "tool_calls" when there are tool calls, else "stop"."""


@dataclass(frozen=True)
class Fail:
    """An error response in OpenAI's shape: `Fail(429)`, `Fail(500, "upstream exploded")`."""

    status: int = 500
    message: str | None = None
    """Defaults to a message that names the status."""
    retry_after: float | None = None
    """Seconds for the Retry-After header; defaults to the server's `retry_after` for 429/503."""


Answer: TypeAlias = Reply | Fail | str
Responder: TypeAlias = Callable[[ChatRequest], Answer | None]


@dataclass(frozen=True)
class Rule:
    """When a request matches, answer with `respond` instead of the built-in behaviour.

    All given conditions must hold: `contains` (a substring of any message's text), `pattern`
    (a regex searched in the same text) and `when` (a predicate). A rule with none matches
    every request. `times` limits how often the rule answers; `delay` adds seconds of latency.

        Rule(contains="capital of France", respond="Paris")
        Rule(when=lambda r: r.model == "judge", respond=lambda r: Reply(str(len(r.text))))
    """

    respond: Answer | Responder
    contains: str | None = None
    pattern: str | None = None
    when: Callable[[ChatRequest], bool] | None = None
    times: int | None = None
    delay: float = 0.0

    @cached_property
    def _regex(self) -> re.Pattern[str] | None:
        return re.compile(self.pattern) if self.pattern is not None else None

    def matches(self, request: ChatRequest) -> bool:
        """Whether every condition of this rule holds for `request`."""
        if self.contains is not None and self.contains not in request.text:
            return False
        regex = self._regex
        if regex is not None and regex.search(request.text) is None:
            return False
        return self.when is None or self.when(request)

    def answer(self, request: ChatRequest) -> Reply | Fail | None:
        """The answer for a matching request (None: a responder declined it)."""
        answer = self.respond(request) if callable(self.respond) else self.respond
        return Reply(answer) if isinstance(answer, str) else answer


ScriptLike: TypeAlias = Iterable[Rule] | Mapping[str, Answer]


def as_rules(script: ScriptLike) -> tuple[Rule, ...]:
    """Rules from a list of rules or from a `{substring: answer}` mapping."""
    if isinstance(script, Mapping):
        return tuple(Rule(contains=key, respond=answer) for key, answer in script.items())
    return tuple(script)


@dataclass(frozen=True)
class Scripted:
    """What the script decided for one request."""

    answer: Reply | Fail
    delay: float


class Script:
    """An ordered list of rules plus how often each has answered.

    Only the server's event loop calls `decide`; `add` may be called from any thread because it
    swaps in a new tuple rather than mutating the one being read.
    """

    def __init__(self, script: ScriptLike = ()) -> None:
        self._rules = as_rules(script)
        self._uses: dict[int, int] = {}

    def add(self, rule: Rule) -> None:
        """Append a rule (it answers only what earlier rules do not)."""
        self._rules = (*self._rules, rule)

    def clear(self) -> None:
        """Drop every rule and forget how often they answered."""
        self._rules = ()
        self._uses = {}

    def decide(self, request: ChatRequest) -> Scripted | None:
        """The first matching rule's answer, or None to use the built-in behaviour."""
        # Rules are only ever appended, so a rule's index is a stable key for its use count.
        for index, rule in enumerate(self._rules):
            used = self._uses.get(index, 0)
            if rule.times is not None and used >= rule.times:
                continue
            if not rule.matches(request):
                continue
            answer = rule.answer(request)
            if answer is None:
                continue
            self._uses[index] = used + 1
            return Scripted(answer, rule.delay)
        return None
