"""One finished rollout as the engine stores it: its attempt record and its trajectory.

    record = classify(item, result, calls, duration_ms=812.0, rollout_id=rid, endpoint=e)
    document = attempt_trajectory(item, result, record, calls, trial_dir=trial)

Outcomes follow the reference: a failed rollout is `failed` with its category as the error
type (or `rollout_protocol_error` when the server refused or garbled the rollout, or
`resource_limit` when the result is a site's `ResultWithBreach`: a sandbox limit stopped it),
`remove_sample` is `skipped`, anything else `success` with the grader's reward. The bridge's
per-call tokens, cost and latency are the authoritative accounting.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from osmosis._version import __version__
from osmosis.eval.results.records import AttemptRecord, PolicyCall, WorkItem
from osmosis.eval.results.trial_outputs import read_trial_json
from osmosis.eval.sites.api import (
    PROTOCOL_ERROR,
    RESOURCE_LIMIT,
    ResultWithBreach,
    ResultWithTrajectory,
)
from osmosis.rollout.grader import MAX_EXPLANATION_CHARS, REWARD_EXPLANATION
from osmosis.rollout.protocol import RolloutResultResponse
from osmosis.rollout.trajectory import (
    ATIF_FINAL_METRICS,
    ATIF_STEP_METRICS,
    build_trajectory,
    conformant_metrics,
)
from osmosis.rollout.types import RolloutStatus


def classify(
    item: WorkItem,
    result: RolloutResultResponse,
    calls: Sequence[PolicyCall],
    *,
    rollout_id: str,
    duration_ms: float,
    endpoint: str | None = None,
    node: str | None = None,
    finished_at: datetime | None = None,
) -> AttemptRecord:
    """Map a terminal rollout result to an attempt record, as the reference classifies it.
    `finished_at`: when the attempt ended (default: now)."""
    sample = result.sample
    error_type: str | None = None
    error_message: str | None = None
    reward: float | None = None
    explanation: str | None = None
    if result.status is not RolloutStatus.SUCCESS:
        status = "failed"
        if isinstance(result, ResultWithBreach):
            error_type = RESOURCE_LIMIT
        elif result.err_message and result.err_message.startswith(PROTOCOL_ERROR):
            error_type = PROTOCOL_ERROR
        elif result.err_category is not None:
            error_type = str(result.err_category.value)
        else:
            error_type = "rollout_failed"
        error_message = result.err_message
    elif sample is not None and sample.remove_sample:
        status = "skipped"
    else:
        status = "success"
        reward = sample.reward if sample is not None else None
        said = sample.extra_fields.get(REWARD_EXPLANATION) if sample is not None else None
        explanation = said[:MAX_EXPLANATION_CHARS] if isinstance(said, str) and said else None
    prompt = sum(call.prompt_tokens or 0 for call in calls)
    completion = sum(call.completion_tokens or 0 for call in calls)
    costs = [call.cost_usd for call in calls if call.cost_usd is not None]
    return AttemptRecord(
        row_index=item.row_index,
        run_index=item.run_index,
        rollout_id=rollout_id,
        source_row_index=item.source_row_index,
        status=status,
        reward=float(reward) if reward is not None else None,
        tokens=prompt + completion,
        prompt_tokens=prompt,
        completion_tokens=completion,
        cost_usd=float(sum(costs)) if costs else None,
        duration_ms=round(duration_ms, 3),
        error_type=error_type,
        error_message=error_message,
        reward_explanation=explanation,
        trajectory_filename="trajectory.json",
        endpoint=endpoint,
        node=node,
        finished_at=finished_at or datetime.now(UTC),
    )


def attempt_trajectory(
    item: WorkItem,
    result: RolloutResultResponse,
    record: AttemptRecord,
    calls: Sequence[PolicyCall],
    *,
    trial_dir: Path | None,
) -> dict[str, Any]:
    """The rollout's own ATIF document when it sent or wrote one, else one built from the
    sample; either way enriched with the bridge's accounting."""
    if isinstance(result, ResultWithTrajectory) and result.trajectory is not None:
        found: Any = result.trajectory  # sent with the result: no file was written
    elif trial_dir is not None:
        # The rollout wrote it: read without following links, bounded, an object or nothing.
        found = read_trial_json(trial_dir, "trajectory.json")
    else:
        found = None
    document = found if isinstance(found, dict) else None
    if document is None:
        messages = result.sample.messages if result.sample is not None else item.messages
        document = build_trajectory(
            rollout_id=record.rollout_id,
            messages=list(messages),
            agent_version=__version__,
            osmosis={
                "rollout_id": record.rollout_id,
                "label": item.label,
                "reward": record.reward,
                "request_metadata": item.metadata,
            },
        )
    return enrich_trajectory(document, calls, record)


def enrich_trajectory(
    document: dict[str, Any], calls: Sequence[PolicyCall], record: AttemptRecord
) -> dict[str, Any]:
    """Add the bridge's per-call tokens, cost and latency: the authoritative accounting."""
    agent_steps = [s for s in document.get("steps", []) if s.get("source") == "agent"]
    remaining = list(calls)
    for step in agent_steps:
        for index, call in enumerate(remaining):
            response = call.response_message or {}
            if response.get("content") in (step.get("message"), None) or not step.get("message"):
                metrics = dict(step.get("metrics") or {})
                metrics.update(
                    {
                        key: value
                        for key, value in (
                            ("prompt_tokens", call.prompt_tokens),
                            ("completion_tokens", call.completion_tokens),
                            ("cost_usd", call.cost_usd),
                        )
                        if value is not None
                    }
                )
                metrics["extra"] = {**_mapping(metrics.get("extra")),
                                    "latency_ms": round(call.latency_ms, 3)}  # fmt: skip
                step["metrics"] = metrics
                if call.model:
                    step["model_name"] = call.model
                del remaining[index]
                break
    # Written ATIF-conformant here, where it is made: the run's copy for the official
    # `eval upload` (`rollout_trials/`) is then a hard link, not a second document.
    for step in document.get("steps", []):
        if isinstance(step, dict) and "metrics" in step:
            step["metrics"] = conformant_metrics(step["metrics"], ATIF_STEP_METRICS)
    final = dict(_mapping(document.get("final_metrics")))
    final.update(
        total_prompt_tokens=record.prompt_tokens or 0,
        total_completion_tokens=record.completion_tokens or 0,
    )
    final["extra"] = {**_mapping(final.get("extra")), "total_policy_calls": len(calls)}
    if record.cost_usd is not None:
        final["total_cost_usd"] = record.cost_usd
    document["final_metrics"] = conformant_metrics(final, ATIF_FINAL_METRICS)
    osmosis = document.setdefault("extra", {}).setdefault("osmosis", {})
    osmosis.update(
        row_index=record.row_index,
        run_index=record.run_index,
        status=record.status,
        error_type=record.error_type,
        policy_calls=[
            {
                "model": call.model,
                "status_code": call.status_code,
                "prompt_tokens": call.prompt_tokens,
                "completion_tokens": call.completion_tokens,
                "cost_usd": call.cost_usd,
                "latency_ms": round(call.latency_ms, 3),
            }
            for call in calls
        ],
    )
    return document


def _mapping(value: object) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


__all__ = ["attempt_trajectory", "classify", "enrich_trajectory"]
