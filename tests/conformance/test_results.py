"""GET /rollout/{id}/result: lease header, long-poll timing, lease expiry and retention."""

from __future__ import annotations

import time

from .apps.behaviours import CANCELLED_MARKER
from .harness import RolloutServer, Submitted, is_idle, meta, new_id, rollout_body
from .settings import MAIN, TIGHT


def _wait_running(server: RolloutServer, handle: Submitted) -> None:
    """Long-poll until the rollout reports `running` (it starts out `queued`)."""
    deadline = time.monotonic() + 10.0
    while (status := server.result(handle.rollout_id, handle.lease).json()["status"]) != "running":
        assert status == "queued", status
        assert time.monotonic() < deadline, "rollout never reported running"


def test_result_without_lease_header_is_422(main: RolloutServer) -> None:
    handle = main.submit(meta(behaviour="sleep:0.3"))

    assert main.result(handle.rollout_id, None).status_code == 422
    assert main.result(handle.rollout_id, "").status_code == 422
    assert main.result(new_id(), None).status_code == 422
    assert main.wait_terminal(handle)["status"] == "success"


def test_wrong_lease_is_403_in_flight_and_after_completion(main: RolloutServer) -> None:
    handle = main.submit(meta(behaviour="sleep:0.3"))
    other = main.submit(meta())

    assert main.result(handle.rollout_id, "not-the-lease").status_code == 403
    # A lease is bound to its own rollout.
    assert main.result(handle.rollout_id, other.lease).status_code == 403
    assert main.wait_terminal(handle)["status"] == "success"
    assert main.result(handle.rollout_id, "not-the-lease").status_code == 403
    assert main.wait_terminal(other)["status"] == "success"


def test_unknown_rollout_is_404(main: RolloutServer) -> None:
    assert main.result(new_id(), "some-lease").status_code == 404


def test_long_poll_returns_as_soon_as_the_status_changes(main: RolloutServer) -> None:
    # MAIN long-polls for 5 s; a 0.5 s rollout must be over well before a single poll would
    # time out, which it can only be if every poll returned on a status change.
    handle = main.submit(meta(behaviour="sleep:0.5"))
    started = time.monotonic()

    result = main.wait_terminal(handle)

    assert result["status"] == "success"
    assert time.monotonic() - started < MAIN.result_wait_timeout_sec - 1.5


def test_long_poll_returns_the_current_status_after_the_wait_timeout(
    tight: RolloutServer,
) -> None:
    handle = tight.submit(meta(behaviour="sleep:30"))
    _wait_running(tight, handle)
    started = time.monotonic()

    response = tight.result(handle.rollout_id, handle.lease)

    elapsed = time.monotonic() - started
    assert response.status_code == 200
    assert response.json() == {
        "rollout_id": handle.rollout_id,
        "status": "running",
        "sample": None,
        "err_message": None,
        "err_category": None,
    }
    assert TIGHT.result_wait_timeout_sec - 0.05 <= elapsed < TIGHT.result_wait_timeout_sec + 3.0


def test_in_flight_statuses_progress_through_grading(main: RolloutServer) -> None:
    # The workflow takes a while too, so the first poll lands before grading starts.
    handle = main.submit(meta(behaviour="sleep:0.3", grade="sleep:0.6"))
    seen: list[str] = []

    result = main.wait_terminal(handle, seen=seen)

    assert result["status"] == "success"
    assert result["sample"]["reward"] == 1.0
    assert "grading" in seen, seen
    order = ["queued", "running", "grading", "success"]
    assert [order.index(s) for s in seen] == sorted(order.index(s) for s in seen), seen


def test_expired_lease_fails_the_rollout_and_cancels_the_workflow(tight: RolloutServer) -> None:
    # Nobody polls: /health renews no lease. The lease runs from admission.
    submitted = time.monotonic()
    handle = tight.submit(meta(behaviour="sleep:30"))

    tight.wait_health(is_idle, timeout=TIGHT.polling_lease_timeout_sec + 10.0)

    assert time.monotonic() - submitted >= TIGHT.polling_lease_timeout_sec - 0.1
    response = tight.result(handle.rollout_id, handle.lease)
    assert response.status_code == 200
    assert response.json() == {
        "rollout_id": handle.rollout_id,
        "status": "failure",
        "sample": None,
        "err_message": "polling lease expired",
        "err_category": "lease_expired",
    }
    # The running workflow coroutine was cancelled, not left to run out its 30 s.
    assert (tight.rollout_dir(handle.rollout_id) / "artifacts" / CANCELLED_MARKER).exists()


def test_polling_keeps_a_rollout_longer_than_the_lease_alive(tight: RolloutServer) -> None:
    handle = tight.submit(meta(behaviour=f"sleep:{TIGHT.polling_lease_timeout_sec + 0.7}"))

    result = tight.wait_terminal(handle)

    assert result["status"] == "success"
    assert result["sample"]["reward"] == 1.0


def test_results_are_retained_then_forgotten(tight: RolloutServer) -> None:
    submitted = time.monotonic()
    handle = tight.submit(meta())
    first = tight.wait_terminal(handle)
    assert first["status"] == "success"

    # Still there, unchanged, well inside the retention window...
    time.sleep(TIGHT.result_retention_sec / 4)
    again = tight.result(handle.rollout_id, handle.lease)
    assert again.status_code == 200
    assert again.json() == first

    # ...and gone once it has passed (retention counts from completion, after submission).
    deadline = time.monotonic() + TIGHT.result_retention_sec + 10.0
    while (status := tight.result(handle.rollout_id, handle.lease).status_code) == 200:
        assert time.monotonic() < deadline, "result was never forgotten"
        time.sleep(0.1)
    assert status == 404
    assert time.monotonic() - submitted >= TIGHT.result_retention_sec - 0.05
    # A forgotten id can be admitted again.
    reused = tight.post_rollout(rollout_body(handle.rollout_id, meta()))
    assert reused.status_code == 202, reused.text
