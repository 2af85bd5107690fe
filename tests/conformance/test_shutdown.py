"""SIGTERM: the server lets what is in flight finish before it exits.

The reference's `503 when shutting down` is not observable over HTTP with uvicorn: on SIGTERM
uvicorn first closes its listening socket and every idle keep-alive connection, waits for open
requests to finish, and only then runs the app's lifespan shutdown, which is where the server
stops accepting rollouts. By then no client can reach it (new connections are refused). What
HTTP clients and the artifact directory can observe is the drain, tested here.
"""

from __future__ import annotations

import signal
import time

from .apps.behaviours import CANCELLED_MARKER
from .harness import RolloutServer, meta


def test_sigterm_lets_the_in_flight_rollout_finish_before_exiting(doomed: RolloutServer) -> None:
    handle = doomed.submit(meta(behaviour="sleep:1.0"))
    doomed.wait_health(lambda h: h["concurrency"]["running"] == 1)
    signalled = time.monotonic()

    doomed.process.send_signal(signal.SIGTERM)
    doomed.process.wait(timeout=20.0)

    rollout_dir = doomed.rollout_dir(handle.rollout_id)
    # The rollout ran to completion (its trajectory was saved) instead of being cancelled.
    assert (rollout_dir / "trajectory.json").exists(), doomed.log_tail()
    assert not (rollout_dir / "artifacts" / CANCELLED_MARKER).exists()
    # So the process outlived the signal by roughly the rollout's remaining sleep.
    assert time.monotonic() - signalled >= 0.3
