"""Agent and grader deadlines: queue time counts, blocked loops still time out, graders get
their own budget."""

from __future__ import annotations

from .apps.behaviours import CANCELLED_MARKER
from .harness import DEFAULT_PROMPT, RolloutServer, meta


def test_time_spent_queued_counts_against_the_agent_deadline(tight: RolloutServer) -> None:
    """TIGHT has one slot. `ahead` holds it for 1.0 s; `behind` needs only 0.8 s of work and
    has 1.5 s, but its clock starts at submission: 1.0 s queued + 0.8 s > 1.5 s."""
    ahead = tight.submit(meta(behaviour="sleep:1.0"))
    behind = tight.submit(meta(behaviour="sleep:0.8"), agent_timeout_sec=1.5)

    ahead_result, behind_result = tight.wait_terminal_all([ahead, behind])

    assert ahead_result["status"] == "success"
    assert behind_result["status"] == "failure"
    assert behind_result["err_category"] == "timeout"
    assert behind_result["sample"] is None


def test_the_same_work_without_a_queue_meets_the_deadline(tight: RolloutServer) -> None:
    """The control for the test above: alone, 0.8 s of work fits in 1.5 s."""
    handle = tight.submit(meta(behaviour="sleep:0.8"), agent_timeout_sec=1.5)

    assert tight.wait_terminal(handle)["status"] == "success"


def test_workflow_past_its_deadline_is_cancelled_and_times_out(main: RolloutServer) -> None:
    handle = main.submit(meta(behaviour="sleep:30"), agent_timeout_sec=0.3)

    result = main.wait_terminal(handle)

    assert result["status"] == "failure"
    assert result["err_category"] == "timeout"
    assert result["sample"] is None
    assert isinstance(result["err_message"], str)
    assert result["err_message"]
    assert (main.rollout_dir(handle.rollout_id) / "artifacts" / CANCELLED_MARKER).exists()


def test_workflow_that_blocks_the_loop_past_its_deadline_times_out(main: RolloutServer) -> None:
    """A synchronous 0.8 s block gives asyncio no chance to fire a 0.3 s deadline; the result
    must still be a timeout, not a late success."""
    handle = main.submit(meta(behaviour="block:0.8"), agent_timeout_sec=0.3)

    result = main.wait_terminal(handle)

    assert result["status"] == "failure"
    assert result["err_category"] == "timeout"


def test_hung_grader_times_out_on_its_own_deadline(main: RolloutServer) -> None:
    handle = main.submit(meta(grade="sleep:30"), agent_timeout_sec=30.0, grader_timeout_sec=0.3)

    result = main.wait_terminal(handle)

    assert result["status"] == "failure"
    assert result["err_category"] == "timeout"
    # The workflow's sample survives a grader failure; its reward is forced null.
    assert result["sample"]["messages"] == [*DEFAULT_PROMPT, {"role": "assistant", "content": "4"}]
    assert result["sample"]["reward"] is None


def test_grading_does_not_spend_the_agent_deadline(main: RolloutServer) -> None:
    """0.3 s of work plus 0.6 s of grading exceeds the 0.6 s agent deadline, but grading has
    its own 1.5 s budget."""
    handle = main.submit(
        meta(behaviour="sleep:0.3", grade="sleep:0.6"),
        agent_timeout_sec=0.6,
        grader_timeout_sec=1.5,
    )

    result = main.wait_terminal(handle)

    assert result["status"] == "success"
    assert result["sample"]["reward"] == 1.0
