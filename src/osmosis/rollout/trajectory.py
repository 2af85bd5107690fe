"""ATIF v1.7 trajectory documents: one per finished rollout, written beside its artifacts."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from osmosis.rollout.context import PolicyCall
from osmosis.rollout.types import Message

ATIF_VERSION = "ATIF-v1.7"
AGENT_NAME = "osmosis-rollout-sdk"
# ATIF's metric objects forbid unknown keys (the official client validates trajectories
# strictly): ours (a call's latency, the run's policy calls) go into each object's `extra`.
ATIF_STEP_METRICS = frozenset(
    {"prompt_tokens", "completion_tokens", "cached_tokens", "cost_usd", "prompt_token_ids",
     "completion_token_ids", "logprobs", "extra"}
)  # fmt: skip
ATIF_FINAL_METRICS = frozenset(
    {"total_prompt_tokens", "total_completion_tokens", "total_cached_tokens", "total_cost_usd",
     "total_steps", "extra"}
)  # fmt: skip
_SOURCES = {"system": "system", "developer": "system", "user": "user", "assistant": "agent"}

logger = logging.getLogger(__name__)


def build_trajectory(
    *,
    rollout_id: str,
    messages: Sequence[Message],
    calls: Sequence[PolicyCall] = (),
    agent_version: str,
    osmosis: Mapping[str, Any],
) -> dict[str, Any]:
    """An ATIF document for one rollout.

    doc = build_trajectory(rollout_id="r1", messages=msgs, agent_version="0.1.0", osmosis={})
    doc["steps"][0]["source"]  # "system" or "user"
    """
    steps: list[dict[str, Any]] = []
    unmatched = list(calls)
    for message in messages:
        role = str(message.get("role", ""))
        if role == "tool" and steps and steps[-1]["source"] == "agent":
            result = {"source_call_id": message.get("tool_call_id"), "content": _text(message)}
            steps[-1].setdefault("observation", {"results": []})["results"].append(result)
            continue
        step: dict[str, Any] = {
            "step_id": len(steps) + 1,
            "source": _SOURCES.get(role, "user" if role != "tool" else "agent"),
            "message": _text(message),
        }
        tool_calls = message.get("tool_calls")
        if tool_calls:
            step["tool_calls"] = [_tool_call(call) for call in tool_calls]
        if role == "assistant":
            call = _take_matching_call(unmatched, message)
            if call is not None:
                step["model_name"] = call.model
                metrics = _drop_none(
                    {
                        "prompt_tokens": call.prompt_tokens,
                        "completion_tokens": call.completion_tokens,
                    }
                )
                if call.latency_ms is not None:
                    metrics["extra"] = {"latency_ms": call.latency_ms}
                step["metrics"] = metrics
        steps.append(_drop_none(step))
    final: dict[str, Any] = {"total_steps": len(steps)}
    if calls:
        final["total_prompt_tokens"] = sum(c.prompt_tokens or 0 for c in calls)
        final["total_completion_tokens"] = sum(c.completion_tokens or 0 for c in calls)
        final["extra"] = {"total_policy_calls": len(calls)}
    return {
        "schema_version": ATIF_VERSION,
        "session_id": rollout_id,
        "trajectory_id": rollout_id,
        "agent": {"name": AGENT_NAME, "version": agent_version},
        "steps": steps,
        "final_metrics": final,
        "extra": {"osmosis": dict(osmosis)},
    }


def conformant_metrics(metrics: Any, allowed: frozenset[str]) -> Any:
    """`metrics` with the keys ATIF does not define (not in `allowed`) moved into its
    `extra`; the same object when there are none.

    conformant_metrics({"prompt_tokens": 3, "latency_ms": 1.5}, ATIF_STEP_METRICS)
    # {"prompt_tokens": 3, "extra": {"latency_ms": 1.5}}
    """
    if not isinstance(metrics, Mapping) or all(key in allowed for key in metrics):
        return metrics
    kept = {k: v for k, v in metrics.items() if k in allowed}
    moved = {k: v for k, v in metrics.items() if k not in allowed}
    extra = metrics.get("extra")
    kept["extra"] = {**(extra if isinstance(extra, Mapping) else {}), **moved}
    return kept


def write_trajectory(path: Path, document: Mapping[str, Any]) -> None:
    """Write atomically, best effort: a trajectory must never change a rollout's outcome.

    One writer per trajectory (one rollout), so the temporary name beside it is fixed.
    """
    try:
        # One dumps and one write: json.dump to a temp file writes chunk by chunk, which
        # cost more than the rest of a fast rollout; tempfile's random names cost ~80 us more.
        replace_bytes(path, json.dumps(document, default=_fallback, allow_nan=False).encode())
    except (OSError, TypeError, ValueError):
        logger.warning("could not write trajectory %s", path, exc_info=True)


# Truncating, not exclusive: a leftover from a rollout server killed mid-write is replaced.
def replace_bytes(path: Path, data: bytes) -> None:
    """Replace `path` with `data` atomically (a temporary file beside it, then a rename),
    without an fsync; creates the folder on its first file. The temporary name is fixed, so
    one writer per path; a link planted at that name is not followed."""
    tmp = path.with_name(f".{path.name}.tmp")
    _write_all(_open_for_writing(tmp), data)
    os.replace(tmp, path)


def write_bytes_in_place(path: Path, data: bytes) -> None:
    """Create or truncate `path` and write `data` to it: no temporary file, no rename, no
    fsync. For a file whose commit point is elsewhere (a run journal line written after it):
    a write torn by a crash belongs to an attempt the journal does not hold, rewritten on
    resume. Why not `replace_bytes`: on ext4 a rename per file made each later fsync of the
    journal cost ~0.8 ms of CPU per renamed file, against ~0.03 ms written in place. A link
    planted at `path` is not followed: it is replaced, through `replace_bytes`."""
    try:
        fd = _open_for_writing(path)
    except OSError as error:
        if error.errno != errno.ELOOP:  # ELOOP: a link at `path`
            raise
        replace_bytes(path, data)
        return
    _write_all(fd, data)


_CREATE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)


def _open_for_writing(path: Path) -> int:
    try:
        return os.open(path, _CREATE, 0o644)
    except FileNotFoundError:  # the folder's first file: one mkdir, not one per file
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, _CREATE, 0o644)


def _write_all(fd: int, data: bytes) -> None:
    """Write all of `data` to `fd`, then close it."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _take_matching_call(calls: list[PolicyCall], message: Message) -> PolicyCall | None:
    for index, call in enumerate(calls):
        if call.response_message.get("content") == message.get("content") and (
            call.response_message.get("tool_calls") == message.get("tool_calls")
        ):
            return calls.pop(index)
    return None


def _tool_call(call: Any) -> dict[str, Any]:
    function = call.get("function", {}) if isinstance(call, Mapping) else {}
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):
            arguments = json.loads(arguments)
    return {
        "tool_call_id": call.get("id") if isinstance(call, Mapping) else None,
        "function_name": function.get("name"),
        "arguments": arguments,
    }


def _text(message: Message) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: keep the text ones
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return str(content)


def _drop_none(values: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}


def _fallback(value: Any) -> Any:
    return repr(value)
