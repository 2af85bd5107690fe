"""What the two conformance entrypoints do, written once and imported by both.

`app_osmosis.py` (our SDK) and `app_osmosis_ai.py` (the open-source osmosis-ai SDK) each subclass
their SDK's `AgentWorkflow` and `Grader` and delegate here, so the two servers behave the same by
construction. This module imports no SDK (everything SDK-specific arrives as an argument) and
runs on Python 3.11 and 3.12 alike; the test harness imports it for the names below.

    metadata["behaviour"]   # the workflow's script; "echo" when absent or metadata is None
    metadata["grade"]       # the grader's script; "exact" when absent

A script is `name` or `name:<seconds>`.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Written into ctx.artifacts_dir by `sleep:<s>` when the workflow is cancelled, so a test can see
# from outside that the server really stopped the running coroutine.
CANCELLED_MARKER = "cancelled.txt"
# Written by `sleep:<s>` once the workflow is inside its sleep: a server may count a rollout as
# running before its coroutine first runs, and a cancel then lands before the `try` below.
SLEEPING_MARKER = "sleeping.txt"
# What `artifact` writes under ctx.artifacts_dir (relative path -> text).
ARTIFACT_FILES = {
    "note.txt": "written by the conformance workflow\n",
    "nested/data.json": "[1, 2]\n",
}
# The description every rollout's ctx.config starts with; `context` reports it, then changes it.
CONFIG_DESCRIPTION = "pristine"
# The grader's `extra` script sets these on the sample, plus one NaN value that must be dropped.
GRADER_EXTRA_FIELDS = {"grader": "conformance"}

ENV_PORT = "_OSMOSIS_ROLLOUT_PORT"
ENV_RESULT_WAIT = "CONFORMANCE_RESULT_WAIT"
ENV_LEASE_TIMEOUT = "CONFORMANCE_LEASE_TIMEOUT"
ENV_RETENTION = "CONFORMANCE_RETENTION"
ENV_MAX_CONCURRENT = "CONFORMANCE_MAX_CONCURRENT"
ENV_MAX_PENDING = "CONFORMANCE_MAX_PENDING"
ENV_API_KEY = "CONFORMANCE_API_KEY"
# Spelling of "no limit" for the two optional integer settings.
UNBOUNDED = "none"


@dataclass(frozen=True)
class ServerSettings:
    """How an entrypoint builds its backend and server; travels as environment variables."""

    port: int = 8000
    result_wait_timeout_sec: float = 30.0
    polling_lease_timeout_sec: float = 120.0
    result_retention_sec: float = 900.0
    max_concurrent: int | None = 4
    max_pending: int | None = None
    api_key: str | None = None

    def to_env(self) -> dict[str, str]:
        env = {
            ENV_PORT: str(self.port),
            ENV_RESULT_WAIT: repr(self.result_wait_timeout_sec),
            ENV_LEASE_TIMEOUT: repr(self.polling_lease_timeout_sec),
            ENV_RETENTION: repr(self.result_retention_sec),
            ENV_MAX_CONCURRENT: _optional_int_text(self.max_concurrent),
            ENV_MAX_PENDING: _optional_int_text(self.max_pending),
        }
        if self.api_key is not None:
            env[ENV_API_KEY] = self.api_key
        return env

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ServerSettings:
        default = cls()
        return cls(
            port=int(env.get(ENV_PORT, default.port)),
            result_wait_timeout_sec=float(
                env.get(ENV_RESULT_WAIT, default.result_wait_timeout_sec)
            ),
            polling_lease_timeout_sec=float(
                env.get(ENV_LEASE_TIMEOUT, default.polling_lease_timeout_sec)
            ),
            result_retention_sec=float(env.get(ENV_RETENTION, default.result_retention_sec)),
            max_concurrent=_parse_optional_int(env.get(ENV_MAX_CONCURRENT), default.max_concurrent),
            max_pending=_parse_optional_int(env.get(ENV_MAX_PENDING), default.max_pending),
            api_key=env.get(ENV_API_KEY) or None,
        )


def _optional_int_text(value: int | None) -> str:
    return UNBOUNDED if value is None else str(value)


def _parse_optional_int(text: str | None, default: int | None) -> int | None:
    if text is None or text == "":
        return default
    return None if text == UNBOUNDED else int(text)


def parse_script(metadata: Mapping[str, Any] | None, key: str, default: str) -> tuple[str, float]:
    """Read `name` or `name:<seconds>` from metadata[key]; seconds is 0.0 when absent."""
    raw = metadata.get(key, default) if metadata is not None else default
    name, _, seconds = str(raw).partition(":")
    return name, float(seconds) if seconds else 0.0


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _answer(ctx: Any) -> str:
    """The assistant's reply: metadata["answer"] if given, else the last prompt message echoed."""
    metadata = ctx.metadata or {}
    if isinstance(metadata.get("answer"), str):
        return str(metadata["answer"])
    return str(ctx.prompt[-1]["content"]) if ctx.prompt else ""


def _messages(ctx: Any, content: str) -> list[dict[str, Any]]:
    return [*ctx.prompt, {"role": "assistant", "content": content}]


async def run_workflow(
    ctx: Any,
    *,
    output_type: Callable[..., Any],
    rollout_context: Callable[[], Any],
) -> Any:
    """Body of `AgentWorkflow.run`. `output_type` is the SDK's AgentWorkflowOutput."""
    name, seconds = parse_script(ctx.metadata, "behaviour", "echo")
    if name == "echo":
        return output_type(messages=_messages(ctx, _answer(ctx)), metrics={"turns": 1.0})
    if name == "echo_list":
        return _messages(ctx, _answer(ctx))
    if name == "sleep":
        try:
            if ctx.artifacts_dir is not None:
                _write(Path(ctx.artifacts_dir) / SLEEPING_MARKER, "sleeping\n")
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            if ctx.artifacts_dir is not None:
                _write(Path(ctx.artifacts_dir) / CANCELLED_MARKER, "cancelled\n")
            raise
        return output_type(messages=_messages(ctx, _answer(ctx)), metrics={"turns": 1.0})
    if name == "block":
        # Deliberately synchronous: it holds the event loop, so no asyncio deadline can fire.
        time.sleep(seconds)  # noqa: ASYNC251
        return output_type(messages=_messages(ctx, _answer(ctx)), metrics={"turns": 1.0})
    if name == "raise":
        raise RuntimeError("conformance: workflow raised")
    if name == "raise_value":
        raise ValueError("conformance: workflow rejected its input")
    if name == "raise_timeout":
        raise TimeoutError("conformance: upstream gave up")
    if name == "bad_output":
        return 42
    if name == "none_without_source":
        return None
    if name == "metrics_nan":
        return output_type(messages=_messages(ctx, _answer(ctx)), metrics={"score": math.nan})
    if name == "artifact":
        if ctx.artifacts_dir is None:
            raise RuntimeError("conformance: ctx.artifacts_dir is None")
        for relative, text in ARTIFACT_FILES.items():
            _write(Path(ctx.artifacts_dir) / relative, text)
        return output_type(messages=_messages(ctx, _answer(ctx)))
    if name == "context":
        return output_type(
            messages=_messages(ctx, json.dumps(_describe_context(ctx, rollout_context)))
        )
    raise RuntimeError(f"conformance: unknown behaviour {name!r}")


def _describe_context(ctx: Any, rollout_context: Callable[[], Any]) -> dict[str, Any]:
    """What the workflow can see; then dirty ctx.config to prove each rollout gets a copy."""
    ambient = rollout_context()
    seen = {
        "rollout_id": getattr(ambient, "rollout_id", None),
        "chat_completions_url": getattr(ambient, "chat_completions_url", None),
        "api_key": getattr(ambient, "api_key", None),
        "config_name": ctx.config.name if ctx.config is not None else None,
        "config_description": ctx.config.description if ctx.config is not None else None,
        "has_label": hasattr(ctx, "label"),
        "metadata": ctx.metadata,
        "artifacts_dir": str(ctx.artifacts_dir) if ctx.artifacts_dir is not None else None,
    }
    if ctx.config is not None:
        ctx.config.description = "dirtied by a rollout"
    return seen


async def grade(ctx: Any) -> None:
    """Body of `Grader.grade`."""
    name, seconds = parse_script(ctx.metadata, "grade", "exact")
    if name == "exact":
        _grade_exact(ctx)
    elif name == "sleep":
        await asyncio.sleep(seconds)
        _grade_exact(ctx)
    elif name == "raise":
        raise RuntimeError("conformance: grader raised")
    elif name == "reward_then_raise":
        ctx.set_reward(1.0)
        raise RuntimeError("conformance: grader raised after rewarding")
    elif name == "remove":
        ctx.sample.remove_sample = True
    elif name == "nan":
        ctx.set_reward(math.nan)
    elif name == "none":
        return
    elif name == "extra":
        _grade_exact(ctx)
        ctx.sample.extra_fields.update(GRADER_EXTRA_FIELDS)
        ctx.sample.extra_fields["dropped_at_the_wire"] = math.nan
    else:
        raise RuntimeError(f"conformance: unknown grade {name!r}")


def _grade_exact(ctx: Any) -> None:
    """Reward 1.0 when the label appears in the last message, else 0.0; no sample: no reward."""
    if ctx.sample is None:
        return
    messages = list(ctx.sample.messages)
    last = str(messages[-1].get("content", "")) if messages else ""
    ctx.set_reward(1.0 if ctx.label is not None and ctx.label in last else 0.0)
