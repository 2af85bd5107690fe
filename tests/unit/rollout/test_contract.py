"""The user-facing contract: outputs, samples, rewards, configs and error categories."""

import math

import pytest
from pydantic import ValidationError

from osmosis import (
    AgentWorkflowConfig,
    AgentWorkflowOutput,
    ConcurrencyConfig,
    GraderContext,
    RolloutSample,
)
from osmosis.rollout.errors import categorize_exception
from osmosis.rollout.grader import require_reward
from osmosis.rollout.policy import PolicyError
from osmosis.rollout.types import ErrorCategory
from osmosis.rollout.workflow import coerce_output


class TestAgentWorkflowOutput:
    def test_unknown_fields_are_rejected(self):
        with pytest.raises(ValidationError, match="extra"):
            AgentWorkflowOutput(messages=[], reward=1.0)

    @pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
    def test_non_finite_metrics_are_rejected(self, bad):
        with pytest.raises(ValidationError):
            AgentWorkflowOutput(messages=[], metrics={"turns": bad})

    def test_instances_are_revalidated_when_coerced(self):
        output = AgentWorkflowOutput(messages=[])
        output.metrics["x"] = math.nan  # mutated after construction
        with pytest.raises(ValidationError):
            coerce_output(output)

    def test_bare_list_becomes_messages_and_none_stays_none(self):
        assert coerce_output([{"role": "user", "content": "hi"}]).messages == [
            {"role": "user", "content": "hi"}
        ]
        assert coerce_output(None) is None

    @pytest.mark.parametrize("bad", [42, "text", {"messages": []}])
    def test_anything_else_is_a_type_error(self, bad):
        with pytest.raises(TypeError, match="must return"):
            coerce_output(bad)


class TestRolloutSample:
    def test_trajectory_messages_default_to_a_copy_of_messages(self):
        messages = [{"role": "user", "content": "hi"}]
        sample = RolloutSample(messages=messages)
        assert sample.trajectory_messages == messages
        assert sample.trajectory_messages is not sample.messages

    def test_explicit_none_disables_the_trajectory(self):
        assert RolloutSample(messages=[], trajectory_messages=None).trajectory_messages is None

    @pytest.mark.parametrize("bad", [math.nan, math.inf])
    def test_reward_assignment_rejects_non_finite(self, bad):
        sample = RolloutSample()
        with pytest.raises(ValidationError):
            sample.reward = bad

    def test_wire_copy_drops_unencodable_and_non_finite_diagnostics(self):
        sample = RolloutSample(
            messages=[{"role": "assistant", "content": "4"}],
            metrics={"ok": 1.5, "nan": math.nan, "obj": object()},
            extra_fields={"fine": [1, 2], "inf": math.inf},
        )
        wire = sample.wire_copy()
        assert wire.trajectory_messages is None
        assert wire.metrics == {"ok": 1.5}
        assert wire.extra_fields == {"fine": [1, 2]}


class TestGraderContext:
    def test_set_reward_stores_a_float(self):
        ctx = GraderContext(label="4", sample=RolloutSample())
        ctx.set_reward(1)
        assert ctx.sample.reward == 1.0 and isinstance(ctx.sample.reward, float)

    @pytest.mark.parametrize(
        ("bad", "error"),
        [(math.nan, ValueError), (math.inf, ValueError), ("1", TypeError), (True, TypeError)],
    )
    def test_set_reward_takes_finite_numbers_only(self, bad, error):
        ctx = GraderContext(label="4", sample=RolloutSample())
        with pytest.raises(error):
            ctx.set_reward(bad)
        assert ctx.sample.reward is None

    def test_set_reward_without_sample_explains(self):
        with pytest.raises(ValueError, match="no sample"):
            GraderContext(label="4", sample=None).set_reward(1.0)

    def test_a_graded_sample_needs_a_reward_unless_removed(self):
        with pytest.raises(ValueError, match="no reward"):
            require_reward(RolloutSample())
        require_reward(RolloutSample(remove_sample=True))
        require_reward(RolloutSample(reward=0.0))


def test_configs_keep_user_fields_and_default_to_four_concurrent():
    config = AgentWorkflowConfig(name="m", temperature=0.2)
    assert config.concurrency.max_concurrent == 4
    assert config.model_dump()["temperature"] == 0.2
    with pytest.raises(ValidationError):
        ConcurrencyConfig(max_concurrent=0)


@pytest.mark.parametrize(
    ("exc", "category"),
    [
        (TimeoutError(), ErrorCategory.TIMEOUT),
        (ValueError("x"), ErrorCategory.VALIDATION_ERROR),
        (TypeError("x"), ErrorCategory.VALIDATION_ERROR),
        (AssertionError("x"), ErrorCategory.VALIDATION_ERROR),
        (PolicyError(429, "slow down"), ErrorCategory.HTTP_ERROR),
        (PolicyError(503, "down"), ErrorCategory.HTTP_ERROR),
        (PolicyError(401, "key"), ErrorCategory.HTTP_ERROR),
        (PolicyError(400, "bad request"), ErrorCategory.AGENT_ERROR),
        (RuntimeError("boom"), ErrorCategory.AGENT_ERROR),
        (KeyError("k"), ErrorCategory.AGENT_ERROR),
    ],
)
def test_exceptions_map_to_the_protocol_categories(exc, category):
    assert categorize_exception(exc) is category
