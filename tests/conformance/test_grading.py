"""What a finished rollout reports: samples, rewards, error categories (§3.1 to §3.5, §15)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .apps.behaviours import CONFIG_DESCRIPTION, GRADER_EXTRA_FIELDS
from .harness import DEFAULT_PROMPT, LLM_API_KEY, SAMPLE_KEYS, RolloutServer, meta

ANSWERED = [*DEFAULT_PROMPT, {"role": "assistant", "content": "4"}]


def test_correct_answer_is_a_success_with_reward_one(main: RolloutServer) -> None:
    handle = main.submit(meta(), label="4")

    result = main.wait_terminal(handle)

    assert result == {
        "rollout_id": handle.rollout_id,
        "status": "success",
        "sample": {
            "messages": ANSWERED,
            "label": "4",
            "reward": 1.0,
            "remove_sample": False,
            "metrics": {"turns": 1.0},
            "extra_fields": {},
        },
        "err_message": None,
        "err_category": None,
    }
    assert set(result["sample"]) == SAMPLE_KEYS  # and never trajectory_messages


def test_wrong_answer_is_a_success_with_reward_zero(main: RolloutServer) -> None:
    result = main.wait_terminal(main.submit(meta(answer="5"), label="4"))

    assert result["status"] == "success"
    assert result["sample"]["reward"] == 0.0


def test_bare_message_list_is_the_sample(main: RolloutServer) -> None:
    result = main.wait_terminal(main.submit(meta(behaviour="echo_list")))

    assert result["status"] == "success"
    assert result["sample"]["messages"] == ANSWERED
    assert result["sample"]["metrics"] == {}
    assert result["sample"]["reward"] == 1.0


def test_metadata_without_a_label_is_enough_to_grade(main: RolloutServer) -> None:
    result = main.wait_terminal(main.submit(meta(), label=None))

    assert result["status"] == "success"
    assert result["sample"]["label"] is None
    assert result["sample"]["reward"] == 0.0  # the exact-match grader had no label to match


def test_neither_label_nor_metadata_is_a_silent_failure(main: RolloutServer) -> None:
    # metadata=None: the workflow falls back to echo and the grader never runs.
    handle = main.submit(None, label=None)

    assert main.wait_terminal(handle) == {
        "rollout_id": handle.rollout_id,
        "status": "failure",
        "sample": None,
        "err_message": None,
        "err_category": None,
    }


def test_grade_false_skips_the_grader(main: RolloutServer) -> None:
    result = main.wait_terminal(main.submit(meta(grade="raise"), grade=False))

    assert result["status"] == "success"
    assert result["sample"]["messages"] == ANSWERED
    assert result["sample"]["reward"] is None


def test_workflow_without_output_or_sample_source_ungraded_is_a_success_without_sample(
    main: RolloutServer,
) -> None:
    result = main.wait_terminal(main.submit(meta(behaviour="none_without_source"), grade=False))

    assert result["status"] == "success"
    assert result["sample"] is None


def test_remove_sample_is_a_success_without_reward(main: RolloutServer) -> None:
    result = main.wait_terminal(main.submit(meta(grade="remove")))

    assert result["status"] == "success"
    assert result["sample"]["remove_sample"] is True
    assert result["sample"]["reward"] is None


def test_grader_extra_fields_reach_the_wire_without_non_finite_values(
    main: RolloutServer,
) -> None:
    result = main.wait_terminal(main.submit(meta(grade="extra")))

    assert result["status"] == "success"
    assert result["sample"]["reward"] == 1.0
    assert result["sample"]["extra_fields"] == GRADER_EXTRA_FIELDS


# (behaviour, grade, err_category, message fragment or None, whether the sample survives)
FAILURES = {
    "workflow raises": ("raise", "exact", "agent_error", "conformance: workflow raised", False),
    "workflow ValueError": (
        "raise_value",
        "exact",
        "validation_error",
        "conformance: workflow rejected its input",
        False,
    ),
    "workflow TimeoutError": (
        "raise_timeout",
        "exact",
        "timeout",
        "conformance: upstream gave up",
        False,
    ),
    "workflow returns an int": ("bad_output", "exact", "validation_error", None, False),
    "workflow NaN metric": ("metrics_nan", "exact", "validation_error", None, False),
    "nothing to grade": ("none_without_source", "exact", "validation_error", None, False),
    "grader raises": ("echo", "raise", "agent_error", "conformance: grader raised", True),
    "grader rewards then raises": (
        "echo",
        "reward_then_raise",
        "agent_error",
        "conformance: grader raised after rewarding",
        True,
    ),
    "grader sets NaN": ("echo", "nan", "validation_error", None, True),
    "grader sets no reward": ("echo", "none", "validation_error", None, True),
}


@pytest.mark.parametrize(
    ("behaviour", "grade", "category", "fragment", "has_sample"),
    FAILURES.values(),
    ids=list(FAILURES),
)
def test_failures_are_classified(
    main: RolloutServer,
    behaviour: str,
    grade: str,
    category: str,
    fragment: str | None,
    has_sample: bool,
) -> None:
    result = main.wait_terminal(main.submit(meta(behaviour=behaviour, grade=grade)))

    assert result["status"] == "failure"
    assert result["err_category"] == category
    assert isinstance(result["err_message"], str)
    assert result["err_message"]
    if fragment is not None:
        assert fragment in result["err_message"]
    if has_sample:
        # A grader failure keeps the workflow's sample, with the reward forced to null even
        # when the grader had set one.
        assert result["sample"]["messages"] == ANSWERED
        assert result["sample"]["reward"] is None
    else:
        assert result["sample"] is None


def test_workflow_sees_its_rollout_context_and_a_private_config_copy(
    main: RolloutServer,
) -> None:
    metadata = meta(behaviour="context")
    handles = [main.submit(metadata, label="secret-label") for _ in range(2)]

    for handle, result in zip(handles, main.wait_terminal_all(handles), strict=True):
        assert result["status"] == "success"
        seen = json.loads(result["sample"]["messages"][-1]["content"])
        assert seen["rollout_id"] == handle.rollout_id
        assert seen["chat_completions_url"] == f"http://127.0.0.1:9/v1/rollouts/{handle.rollout_id}"
        assert seen["api_key"] == LLM_API_KEY
        assert seen["config_name"] == "conformance"
        # Each rollout dirties its ctx.config; the next one still gets a clean copy.
        assert seen["config_description"] == CONFIG_DESCRIPTION
        assert seen["has_label"] is False  # only the grader sees the label
        assert seen["metadata"] == metadata
        expected_dir = main.rollout_dir(handle.rollout_id) / "artifacts"
        assert Path(seen["artifacts_dir"]).resolve() == expected_dir.resolve()
