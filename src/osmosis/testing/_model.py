"""What the fake model answers: injected faults, then the script, then the built-in behaviour.

Built-in behaviour, in order:

1. tools offered and the last message is not a tool result: call the first tool (or the one
   `tool_choice` names) with arguments filled from the question;
2. an arithmetic expression in the last user message: answer the number, e.g. "391";
3. otherwise: echo the last message's text.

So an agent loop with a calculator tool calls it once, then answers the number.

    model = FakeModel(ModelOptions())
    model.answer(ChatRequest({"messages": [{"role": "user", "content": "What is 2 * 3?"}]}))
    # Decision(answer=Reply(content="6"), delay=0.0)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from osmosis.testing._arithmetic import find_expression, format_number
from osmosis.testing._faults import Faults
from osmosis.testing._tools import fill_arguments
from osmosis.testing.script import ChatRequest, Fail, Reply, Script, ToolCall, message_text


@dataclass(frozen=True)
class ModelOptions:
    """How the fake model behaves; see `FakeModelServer` for each option."""

    latency: float = 0.0
    wrong_rate: float = 0.0
    seed: int = 0
    error_rate: float = 0.0
    error_status: int = 429
    retry_after: float = 1.0
    model: str = "fake-model"
    rate_limit: float = 0.0

    def __post_init__(self) -> None:
        problems = []
        if self.latency < 0:
            problems.append(f"latency must be >= 0, got {self.latency}")
        if self.rate_limit < 0:
            problems.append(f"rate_limit must be >= 0 calls per second, got {self.rate_limit}")
        if self.retry_after < 0:
            problems.append(f"retry_after must be >= 0, got {self.retry_after}")
        for name in ("wrong_rate", "error_rate"):
            value = getattr(self, name)
            if not 0 <= value <= 1:
                problems.append(f"{name} must be between 0 and 1, got {value}")
        if not 400 <= self.error_status <= 599:
            problems.append(f"error_status must be a 4xx or 5xx status, got {self.error_status}")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass(frozen=True)
class Decision:
    """The answer to one request and the extra seconds to wait before giving it."""

    answer: Reply | Fail
    delay: float = 0.0


@dataclass
class FakeModel:
    """Turns a `ChatRequest` into a `Decision`. Not thread-safe: one event loop drives it."""

    options: ModelOptions
    script: Script = field(default_factory=Script)

    def __post_init__(self) -> None:
        self.faults = Faults(
            wrong_rate=self.options.wrong_rate,
            error_rate=self.options.error_rate,
            seed=self.options.seed,
        )

    def answer(self, request: ChatRequest) -> Decision:
        if self.faults.should_fail(request.messages):
            return Decision(Fail(self.options.error_status))
        scripted = self.script.decide(request)
        if scripted is not None:
            return Decision(scripted.answer, scripted.delay)
        return Decision(self.builtin(request))

    def builtin(self, request: ChatRequest) -> Reply:
        """The unscripted answer (tool call, arithmetic or echo)."""
        prompt = request.last_user_text
        expression = find_expression(prompt)
        tool = _chosen_tool(request)
        if tool is not None and request.last_message.get("role") != "tool":
            arguments = fill_arguments(tool.get("parameters"), prompt, expression)
            return Reply(tool_calls=[ToolCall(str(tool.get("name", "")), arguments)])
        if expression is not None:
            value = expression.value
            if self.faults.is_wrong(prompt):
                value += self.faults.wrong_offset(prompt)
            return Reply(format_number(value))
        return Reply(message_text(request.last_message))


def _chosen_tool(request: ChatRequest) -> Mapping[str, Any] | None:
    """The function to call: the one `tool_choice` names, else the first; None for "none"."""
    functions: list[Mapping[str, Any]] = [
        t["function"] for t in request.tools if isinstance(t.get("function"), Mapping)
    ]
    choice = request.body.get("tool_choice")
    if not functions or choice == "none":
        return None
    if isinstance(choice, Mapping) and isinstance(choice.get("function"), Mapping):
        wanted = choice["function"].get("name")
        return next((f for f in functions if f.get("name") == wanted), functions[0])
    return functions[0]
