"""A model call waiting for a slot of the bridge's adaptive limit is not its attempt's fault
(issue 28.3): the provider never saw it, so an attempt whose agent deadline passes meanwhile
goes back to pending (counted, and said in the run log) instead of failing `timeout`. The
engine, a real rollout server, the model bridge and the scripted model, limited to 2 calls/s.

A provider merely slow for one call still yields `timeout`
(test_bridge_limits.py::test_one_slow_call_while_others_are_answered_still_times_out).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from osmosis.eval.model.bridge import ModelBridge
from osmosis.testing import FakeModelServer
from tests.integration.conftest import serving
from tests.integration.test_bridge_limits import (
    PATIENT,
    chatty_app,
    evaluate,
    open_run,
    target,
)


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_attempts_whose_calls_wait_for_a_slot_past_their_deadline_go_back_to_pending(
    tmp_path: Path,
) -> None:
    rows = 16  # two calls each: ~16 s at 2 calls/s, far past any one attempt's 3 s
    trials = tmp_path / "trials"
    run = open_run(tmp_path / "run", rows)
    with (
        run,
        FakeModelServer(rate_limit=2, retry_after=1) as model,
        serving(chatty_app(trials)) as url,
    ):
        bridge = ModelBridge(
            target=target(model.base_url, uuid.uuid4().hex), retry=PATIENT, max_in_flight=32
        )
        async with bridge:
            outcome = await evaluate(
                bridge, run, url, trials, rows, concurrency=32, agent_timeout=3
            )
        assert outcome.halted is None
        records = run.records()
        assert [(r.status, r.error_type) for r in records] == [("success", None)] * rows
        assert outcome.requeued >= 1  # 32 attempts at once cannot all be served in 3 s
    log = (tmp_path / "run" / "logs.txt").read_text()
    assert "on the provider's rate limit, unserved (for a slot" in log
    assert log.count("back to pending (its model calls waited") == outcome.requeued
