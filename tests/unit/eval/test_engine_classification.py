"""The engine's classification table, in memory (issue 11, point 8): what every kind of
rollout outcome and fault becomes. `pending` means "not recorded; a resume runs it"."""

from __future__ import annotations

import asyncio
import re
import time
from datetime import UTC, datetime

import pytest

from osmosis.eval import engine as engine_module
from osmosis.eval.engine import RAMP_ADMISSIONS, RECORD_AFTER_SEC, EngineSettings
from tests.unit.eval.engine_world import QUICK, MemorySink, MemorySite, World, evaluate, item

TABLE = [
    # kind            status      error_type                 requeued  why
    ("pass", "success", None, 0),
    ("agent_error", "failed", "agent_error", 0),
    ("admission_4xx", "failed", "rollout_protocol_error", 0),  # this rollout was refused
    ("admission_5xx", "success", None, 1),  # the endpoint's fault: retried
    ("busy_once", "success", None, 1),  # a 429: back off, try again
    ("deadline", "failed", "timeout", 0),
    ("bridge_503", "success", None, 1),  # the provider's fault, not the agent's
    ("remove_sample", "skipped", None, 0),
    ("nan_reward", "failed", "rollout_protocol_error", 0),
    ("malformed", "failed", "rollout_protocol_error", 0),
    ("dies", "success", None, 1),  # endpoint death mid-attempt: re-run on its replacement
    ("stall", "success", None, 1),  # a stalled provider is not an agent timeout
]


@pytest.mark.parametrize(("kind", "status", "error_type", "requeued"), TABLE)
async def test_each_outcome_is_classified_as_a_user_expects(kind, status, error_type, requeued):
    outcome, sink, world, site = await evaluate([item(0, kind)])
    assert [(a.record.status, a.record.error_type) for a in sink.attempts] == [(status, error_type)]
    assert (outcome.dispatched, outcome.recorded, outcome.pending) == (1, 1, 0)
    assert outcome.requeued == requeued and outcome.halted is None
    record = sink.attempts[0].record
    assert record.endpoint == "memory-0" and record.node == "memory-node"
    if requeued:  # the re-run got a fresh rollout id
        assert world.tries[(0, 0)] >= 2 or kind == "busy_once"
    if kind in ("nan_reward", "malformed"):
        assert record.error_message is not None and "malformed result body" in record.error_message
    if kind == "dies":
        assert site.replaced == ["memory-0"]
        assert any("is gone: rollout server 'memory' exited" in line for line in sink.lines)


async def test_the_whole_table_runs_in_well_under_a_second():
    started = time.perf_counter()
    outcome, sink, _, _ = await evaluate(
        [item(row, kind) for row, (kind, *_) in enumerate(TABLE)],
        settings=EngineSettings(**{**QUICK.__dict__, "concurrency": len(TABLE)}),
    )
    assert time.perf_counter() - started < 0.5
    assert outcome.recorded == len(TABLE) == len(sink.attempts)
    got = {a.record.row_index: (a.record.status, a.record.error_type) for a in sink.attempts}
    assert got == {row: (status, error) for row, (_, status, error, _) in enumerate(TABLE)}


async def test_the_bridge_serves_each_attempt_from_dispatch_until_its_calls_are_taken():
    # Dispatched: opened on the bridge. Over: closed before its calls are counted, so no call
    # can reach the provider uncounted. Requeued or recorded: forgotten.
    outcome, sink, world, _ = await evaluate([item(0, "pass"), item(1, "bridge_503")])
    bridge = world.bridge
    recorded = {a.record.rollout_id for a in sink.attempts}
    assert outcome.recorded == 2 and outcome.requeued == 1
    assert recorded < bridge.opened and len(bridge.opened) == 3  # the requeued one's too
    assert bridge.closed == bridge.opened == bridge.forgotten
    assert bridge.taken_open == set()


async def test_an_unexpected_exception_is_a_halt_naming_the_attempt():
    outcome, sink, _, _ = await evaluate([item(0), item(1, "explodes"), item(2)])
    assert outcome.halted is not None
    assert "row 1 run 0" in outcome.halted and "RuntimeError: the rollout client has a bug" in (
        outcome.halted
    )
    assert outcome.pending == outcome.dispatched - outcome.recorded >= 1
    assert outcome.recorded == len(sink.attempts)
    assert all(a.record.row_index != 1 for a in sink.attempts)


async def test_a_sink_that_raises_halts_and_the_counts_stay_exact():
    outcome, sink, _, _ = await evaluate([item(r) for r in range(6)], sink=MemorySink(fail_on=2))
    assert outcome.halted is not None and "row 2 run 0" in outcome.halted
    assert "No space left on device" in outcome.halted
    assert outcome.recorded == len(sink.attempts) and outcome.pending >= 1
    assert outcome.recorded + outcome.pending == outcome.dispatched


async def test_an_attempt_being_stored_when_its_endpoint_dies_is_recorded_once_not_rerun():
    world = World()
    site = MemorySite(world)
    # The record is on its way to disk (the writer thread) when the rollout server dies.
    sink = MemorySink(store_sec=0.05, on_store=lambda _: site.endpoints[0].die("killed"))

    outcome, sink, world, site = await evaluate([item(0)], world=world, site=site, sink=sink)

    assert [a.record.row_index for a in sink.attempts] == [0]
    assert (outcome.recorded, outcome.pending, outcome.requeued) == (1, 0, 0)
    assert world.tries[(0, 0)] == 1


class FailsOnceOthersAreStoring(MemorySink):
    """Row 0's store fails (a halt) only once rows 1-3 are being stored."""

    def __init__(self) -> None:
        super().__init__(store_sec=0.05)
        self.storing = 0
        self.others_storing = asyncio.Event()

    async def store(self, attempt):
        if attempt.record.row_index == 0:
            await self.others_storing.wait()
            raise OSError(28, "No space left on device")
        self.storing += 1
        if self.storing == 3:
            self.others_storing.set()
        await super().store(attempt)


async def test_a_halt_waits_for_the_attempts_being_stored_and_counts_them():
    settings = EngineSettings(**{**QUICK.__dict__, "concurrency": 4})

    outcome, sink, _, _ = await evaluate(
        [item(r) for r in range(4)], sink=FailsOnceOthersAreStoring(), settings=settings
    )

    assert outcome.halted is not None and "row 0 run 0" in outcome.halted
    # Cut short, these three would be on disk yet counted as pending.
    assert sorted(a.record.row_index for a in sink.attempts) == [1, 2, 3]
    assert (outcome.recorded, outcome.pending) == (3, 1)


async def test_a_stall_longer_than_the_outage_wait_halts_with_the_attempts_pending():
    world = World(stall_for=10)
    settings = EngineSettings(**{**QUICK.__dict__, "outage_wait_sec": 0.05})
    outcome, sink, _, _ = await evaluate(
        [item(0, "stall"), item(1, sleep=0.5)], world=world, settings=settings
    )
    assert outcome.halted is not None and "stayed unavailable for more than 0.05 s" in (
        outcome.halted
    )
    assert sink.attempts == [] and outcome.pending == outcome.dispatched == 2


async def test_an_endpoint_that_keeps_dying_halts_when_no_replacement_is_left():
    world = World()
    site = MemorySite(world, restarts=0)
    outcome, sink, _, _ = await evaluate([item(0, "dies"), item(1)], world=world, site=site)
    assert outcome.halted is not None and outcome.halted.startswith("no rollout server left")
    assert "exited unexpectedly (code -9)" in outcome.halted
    assert "restarted 0 times already" in outcome.halted
    assert [a.record.status for a in sink.attempts] in ([], ["success"])  # nothing failed
    assert outcome.recorded + outcome.pending == outcome.dispatched


async def test_attempts_spread_over_endpoints_within_their_capacity():
    world = World()
    site = MemorySite(world, count=2, capacity=2)
    settings = EngineSettings(**{**QUICK.__dict__, "concurrency": 8})
    outcome, sink, _, _ = await evaluate(
        [item(r, sleep=0.005) for r in range(20)], world=world, site=site, settings=settings
    )
    assert outcome.recorded == 20 and not outcome.halted
    assert world.peak_load == {"memory-0": 2, "memory-1": 2}  # never above capacity
    assert world.served_by["memory-0"] >= 8 and world.served_by["memory-1"] >= 8
    assert {a.record.endpoint for a in sink.attempts} == {"memory-0", "memory-1"}


async def test_a_dead_endpoint_is_drained_onto_the_survivor():
    world = World()
    site = MemorySite(world, count=2, restarts=0)
    items = [item(r, sleep=0.005) for r in range(10)] + [item(10, "dies")]
    outcome, sink, _, _ = await evaluate(items, world=world, site=site)
    assert outcome.recorded == 11 and outcome.halted is None
    assert all(a.record.status == "success" for a in sink.attempts)
    assert sorted(a.record.row_index for a in sink.attempts) == list(range(11))


def most_admitting(world: World, rows: range) -> int:
    return max(waiting for row, waiting in world.admissions if row in rows)


async def test_an_endpoint_is_handed_its_first_admissions_a_few_at_a_time_then_freely():
    # All at once, a rollout server admits every one before it runs any rollout, and their
    # model calls leave in one burst (RAMP_ADMISSIONS); afterwards slots free one by one.
    settings = EngineSettings(**{**QUICK.__dict__, "concurrency": 32})
    first = [item(r, sleep=0.05, admit=0.002) for r in range(32)]
    later = [item(r, sleep=0.001, admit=0.05) for r in range(32, 96)]
    outcome, sink, world, _ = await evaluate([*first, *later], settings=settings)

    assert outcome.recorded == 96 and outcome.halted is None
    assert {a.record.status for a in sink.attempts} == {"success"}
    assert world.peak_load["memory-0"] == 32  # every slot still filled
    assert most_admitting(world, range(32)) == RAMP_ADMISSIONS
    assert most_admitting(world, range(32, 96)) > RAMP_ADMISSIONS  # no limit past the ramp


async def test_after_an_outage_the_refilled_slots_are_admitted_a_few_at_a_time_again():
    # During the outage the other attempts finish and their slots wait; when the provider
    # answers again all 16 refill together: row 0 again, then rows 16-30.
    world = World(stall_for=0.2)
    settings = EngineSettings(**{**QUICK.__dict__, "concurrency": 16})
    first = [item(0, "stall"), *(item(r, sleep=0.1) for r in range(1, 16))]
    later = [item(r, sleep=0.001, admit=0.02) for r in range(16, 48)]
    outcome, _, world, _ = await evaluate([*first, *later], world=world, settings=settings)

    assert outcome.recorded == 48 and outcome.halted is None
    assert outcome.requeued == 1  # the attempt the outage caught ran again
    assert most_admitting(world, range(16, 31)) == RAMP_ADMISSIONS


async def test_a_server_that_answers_429_is_never_handed_more_than_a_few_admissions_at_once():
    # The first eight admissions are refused after 50 ms; ten milliseconds later, while the
    # next eight are still being refused, the first eight come back: paced again, not all 16.
    settings = EngineSettings(**{**QUICK.__dict__, "concurrency": 16})
    items = [item(r, "busy_once", sleep=0.001, admit=0.05) for r in range(16)]
    outcome, sink, world, _ = await evaluate(items, settings=settings)

    assert outcome.recorded == 16 and outcome.requeued == 16
    assert {a.record.status for a in sink.attempts} == {"success"}
    assert most_admitting(world, range(16)) == RAMP_ADMISSIONS


async def test_rollout_ids_are_fresh_32_hex_digits_in_every_run():
    # The ids name files and URLs ("[0-9a-f]{32}" where they are read back): each attempt,
    # each re-run and each run (drawn from the OS, a batch at a time) gets its own.
    ids = []
    for _ in range(2):
        _, sink, world, _ = await evaluate([item(row, "pass") for row in range(20)])
        ids.append({a.record.rollout_id for a in sink.attempts} | world.bridge.opened)
    assert all(re.fullmatch(r"[0-9a-f]{32}", rid) for rid in ids[0] | ids[1])
    assert len(ids[0]) == len(ids[1]) == 20
    assert not ids[0] & ids[1]


class StoreTimes(MemorySink):
    """Also keeps when each row's record reached the sink."""

    def __init__(self) -> None:
        super().__init__()
        self.stored_at: dict[int, datetime] = {}

    async def store(self, attempt):
        self.stored_at[attempt.record.row_index] = datetime.now(UTC)
        await super().store(attempt)


async def test_records_made_after_a_wave_keep_the_time_their_attempt_ended():
    # Row 0 ends while row 1 is still in flight: its record is made RECORD_AFTER_SEC later
    # (out of the wave of answers), yet says when the attempt ended, and it does not wait
    # for row 1.
    settings = EngineSettings(**{**QUICK.__dict__, "concurrency": 2})
    sink = StoreTimes()
    outcome, sink, _, _ = await evaluate(
        [item(0, sleep=0.001), item(1, sleep=0.4)], sink=sink, settings=settings
    )

    assert outcome.recorded == 2
    ended = {a.record.row_index: a.record.finished_at for a in sink.attempts}
    waited = (sink.stored_at[0] - ended[0]).total_seconds()
    assert waited >= RECORD_AFTER_SEC * 0.9  # timers may fire a hair early, never much
    assert sink.stored_at[0] < ended[1]


async def test_the_last_attempt_in_flight_is_recorded_without_waiting(monkeypatch):
    # A one-row smoke test, and each run's last attempt, end as soon as they are stored.
    monkeypatch.setattr(engine_module, "RECORD_AFTER_SEC", 30.0)
    started = time.perf_counter()

    outcome, sink, _, _ = await evaluate([item(0, sleep=0.001)])

    assert outcome.recorded == 1 and len(sink.attempts) == 1
    assert time.perf_counter() - started < 10.0


async def test_records_waiting_for_their_wave_never_hold_dispatch_back(monkeypatch):
    # Row 0 runs 0.4 s; rows 1-20 a few ms each, on the other slot. Records "30 s later"
    # are made as soon as waiting for them would stop the dispatch: the short rows all run
    # while row 0 does, rather than queueing behind their own bookkeeping until it ends.
    monkeypatch.setattr(engine_module, "RECORD_AFTER_SEC", 30.0)
    settings = EngineSettings(**{**QUICK.__dict__, "concurrency": 2})

    outcome, sink, _, _ = await evaluate(
        [item(0, sleep=0.4), *(item(row, sleep=0.002) for row in range(1, 21))],
        settings=settings,
    )

    assert outcome.recorded == 21
    ended = {a.record.row_index: a.record.finished_at for a in sink.attempts}
    assert all(ended[row] < ended[0] for row in range(1, 21))
