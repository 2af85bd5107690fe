"""POST /rollout/cancel: selectors, dispositions, idempotence, and what the cancelled report."""

from __future__ import annotations

from typing import Any

import pytest

from .apps.behaviours import CANCELLED_MARKER, SLEEPING_MARKER
from .harness import OSMOSIS_AI, RolloutServer, Submitted, meta, new_id, wait_for_path


def _assert_cancelled(server: RolloutServer, handle: Submitted) -> None:
    result = server.wait_terminal(handle)
    assert result["status"] == "cancelled", result
    assert result["sample"] is None
    assert result["err_category"] is None


def test_cancel_by_ids_stops_running_rollouts_and_reports_unknown_ids(
    main: RolloutServer,
) -> None:
    first = main.submit(meta(behaviour="sleep:30"))
    second = main.submit(meta(behaviour="sleep:30"))
    main.wait_health(lambda h: h["concurrency"]["running"] == 2)
    for handle in (first, second):  # "running" may come before the coroutine's first step
        wait_for_path(main.rollout_dir(handle.rollout_id) / "artifacts" / SLEEPING_MARKER)
    unknown = new_id()

    dispositions = main.cancel_ok({"ids": [first.rollout_id, second.rollout_id, unknown]})

    assert dispositions == {
        first.rollout_id: "cancelled_running",
        second.rollout_id: "cancelled_running",
        unknown: "not_found",
    }
    for handle in (first, second):
        _assert_cancelled(main, handle)
        # The workflow coroutine itself was cancelled.
        wait_for_path(main.rollout_dir(handle.rollout_id) / "artifacts" / CANCELLED_MARKER)
    main.wait_idle()


def test_cancel_is_idempotent(main: RolloutServer) -> None:
    handle = main.submit(meta(behaviour="sleep:30"))
    main.wait_health(lambda h: h["concurrency"]["running"] == 1)

    assert main.cancel_ok({"ids": [handle.rollout_id]}) == {handle.rollout_id: "cancelled_running"}
    _assert_cancelled(main, handle)
    # Once the rollout is terminal, cancelling it again is harmless and reports not_found.
    assert main.cancel_ok({"ids": [handle.rollout_id]}) == {handle.rollout_id: "not_found"}
    _assert_cancelled(main, handle)


def test_cancelling_a_finished_rollout_is_not_found_and_keeps_its_result(
    main: RolloutServer,
) -> None:
    handle = main.submit(meta())
    result = main.wait_terminal(handle)
    assert result["status"] == "success"

    assert main.cancel_ok({"ids": [handle.rollout_id]}) == {handle.rollout_id: "not_found"}
    assert main.wait_terminal(handle) == result


def test_cancel_by_prefix_selects_only_matching_ids(main: RolloutServer) -> None:
    prefix = f"{new_id()[:12]}-"
    finished = main.submit(meta(), rollout_id=f"{prefix}finished")
    assert main.wait_terminal(finished)["status"] == "success"
    matching = [main.submit(meta(behaviour="sleep:30"), rollout_id=f"{prefix}{i}") for i in "ab"]
    bystander = main.submit(meta(behaviour="sleep:30"))
    main.wait_health(lambda h: h["concurrency"]["running"] == 3)

    dispositions = main.cancel_ok({"prefix": prefix})

    # Retained finished rollouts match the prefix too, as not_found.
    assert dispositions == {
        finished.rollout_id: "not_found",
        matching[0].rollout_id: "cancelled_running",
        matching[1].rollout_id: "cancelled_running",
    }
    for handle in matching:
        _assert_cancelled(main, handle)
    health = main.wait_health(lambda h: h["concurrency"]["running"] == 1)
    assert health["lifecycle"]["active_rollouts"] == 1  # the bystander runs on
    main.cancel_ok({"ids": [bystander.rollout_id]})
    _assert_cancelled(main, bystander)


def test_cancel_all_cancels_everything_in_flight(main: RolloutServer) -> None:
    handles = [main.submit(meta(behaviour="sleep:30")) for _ in range(3)]
    main.wait_health(lambda h: h["concurrency"]["running"] == 3)

    dispositions = main.cancel_ok({"all": True})

    for handle in handles:
        assert dispositions[handle.rollout_id] == "cancelled_running"
    # Anything else listed is a retained result from earlier in the session.
    others = {k: v for k, v in dispositions.items() if k not in {h.rollout_id for h in handles}}
    assert set(others.values()) <= {"not_found"}, others
    for handle in handles:
        _assert_cancelled(main, handle)
    main.wait_idle()


def test_rollout_waiting_for_a_slot_reports_its_state_and_cancels_accordingly(
    tight: RolloutServer,
) -> None:
    """A rollout admitted but waiting for a concurrency slot. osmosis-ai 0.3.8 marks it
    `running` as soon as its task starts, though LocalBackend holds it queued; ours reports
    `queued` (what /health says too) and cancels it as `cancelled_queued`. Both are valid
    protocol states; each flavour is held to what it does."""
    holder = tight.submit(meta(behaviour="sleep:30"))
    waiting = tight.submit(meta(behaviour="sleep:30"))
    tight.wait_health(lambda h: (h["concurrency"]["queued"], h["concurrency"]["running"]) == (1, 1))
    state, disposition = (
        ("running", "cancelled_running")
        if tight.flavour is OSMOSIS_AI
        else ("queued", "cancelled_queued")
    )

    polled = tight.result(waiting.rollout_id, waiting.lease).json()

    assert polled["status"] == state
    dispositions = tight.cancel_ok({"ids": [waiting.rollout_id, holder.rollout_id]})
    assert dispositions == {
        waiting.rollout_id: disposition,
        holder.rollout_id: "cancelled_running",
    }
    _assert_cancelled(tight, waiting)
    _assert_cancelled(tight, holder)
    # The waiting workflow never started, so it never saw the cancellation.
    assert not (tight.rollout_dir(waiting.rollout_id) / "artifacts" / CANCELLED_MARKER).exists()


BAD_SELECTORS: dict[str, dict[str, Any]] = {
    "none": {},
    "all false": {"all": False},
    "ids and prefix": {"ids": ["x"], "prefix": "x"},
    "ids and all": {"ids": ["x"], "all": True},
    "prefix and all": {"prefix": "x", "all": True},
    "all three": {"ids": ["x"], "prefix": "x", "all": True},
}


@pytest.mark.parametrize("selector", BAD_SELECTORS.values(), ids=list(BAD_SELECTORS))
def test_cancel_needs_exactly_one_selector(main: RolloutServer, selector: dict[str, Any]) -> None:
    handle = main.submit(meta(behaviour="sleep:30"))
    main.wait_health(lambda h: h["concurrency"]["running"] == 1)

    assert main.cancel(selector).status_code == 422
    # The refused request cancelled nothing.
    assert main.health()["concurrency"]["running"] == 1
    main.cancel_ok({"ids": [handle.rollout_id]})


def test_cancel_with_an_empty_id_list_is_a_no_op(main: RolloutServer) -> None:
    assert main.cancel_ok({"ids": []}) == {}
