"""Adaptive model limits shared by every platform worker through the database (issue 28.3):
two worker processes on one provider key split one limit instead of fighting over it, a
burst of 429s seen by both cuts it once, and no key (nor base URL) is stored. Real worker
processes, a real rate-limited model server, on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from osmosis.eval.model.bridge_limits import DECREASE, INITIAL_LIMIT, AdaptiveLimit
from osmosis.eval.model.providers import ProviderError
from osmosis.platform.core.db import make_engine, make_session_factory
from osmosis.platform.core.db.process_models import ModelLimit, ModelLimitDemand
from osmosis.platform.worker.model_limits import DatabaseLimits, fair_share, limit_hash
from osmosis.testing import FakeModelServer
from tests.e2e.workspace import row
from tests.platform.databases import Databases
from tests.platform.eval_world import Server, finished, make_repo, submit, upload_dataset

RATE = 20  # calls/s the model accepts; above it: 429 with Retry-After 1 s
SECONDS = 20.0  # each pair of workers' load
COUNT_FROM = 5.0  # their ramp (and the first 429s) is not throughput
ROOT = Path(__file__).resolve().parents[2]


def _pair(model: FakeModelServer, key: str, database: str | None) -> list[dict]:
    """Two worker processes, each keeping 128 calls in flight on `key` for SECONDS."""
    start = time.time() + 3  # both import and open their bridge first
    command = [
        sys.executable, "-m", "tests.platform.limit_load", "--model", model.base_url,
        "--key", key, "--start", str(start), "--seconds", str(SECONDS),
        "--count-from", str(COUNT_FROM), "--in-flight", "128",
    ]  # fmt: skip
    if database is not None:
        command += ["--database", database]
    workers = [
        subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    figures = []
    for worker in workers:
        out, err = worker.communicate(timeout=90)
        assert worker.returncode == 0, err
        figures.append(json.loads(out.splitlines()[-1]))
    return figures


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_workers_on_one_key_share_the_limit_with_far_fewer_429s(databases: Databases):
    url = databases.new_url()
    with FakeModelServer(rate_limit=RATE, latency=0.5, retry_after=1.0) as model:
        alone = _pair(model, "key-alone", None)
        shared = _pair(model, "key-shared", url)
    throttled_alone = sum(worker["throttled"] for worker in alone)
    throttled_shared = sum(worker["throttled"] for worker in shared)
    # Sharing: one cut per burst for both, instead of each worker probing past the provider's
    # limit on its own.
    assert throttled_shared * 2 <= throttled_alone, (alone, shared)
    half = RATE / 2 * (SECONDS - COUNT_FROM)
    for worker in shared:
        assert 0.7 * half <= worker["answered"] <= 1.3 * half, shared
        # Both saw the same global limit and 429 count (what `eval info` shows as the limit
        # is each worker's share of it).
        assert worker["shared"] is not None and worker["shared"][1] > 0
    engine = make_engine(url)
    try:
        with make_session_factory(engine)() as db:
            rows = db.execute(select(ModelLimit)).scalars().all()
            assert len(rows) == 1
            assert rows[0].throttled == throttled_shared
            # A worker that ended withdrew its demand: the others get its share.
            assert db.execute(select(ModelLimitDemand)).all() == []
    finally:
        engine.dispose()


async def _throttle(limit: AdaptiveLimit) -> None:
    async def refused() -> None:
        raise ProviderError("rate limited", status=429)

    with pytest.raises(ProviderError):
        await limit.call(refused, owner="run")


def test_a_burst_of_429s_seen_by_two_workers_cuts_the_shared_limit_once(databases: Databases):
    url = databases.new_url()
    engine = make_engine(url)
    key = ("openai", "https://api.example.test/v1", "gpt-x", "3f2a9c0d1e2b4a5f")
    first, second = AdaptiveLimit(key, ceiling=64), AdaptiveLimit(key, ceiling=64)
    # The rounds here are the test's own (`sync`).
    one = DatabaseLimits(engine, worker="worker-one", background=False)
    two = DatabaseLimits(engine, worker="worker-two", background=False)
    try:
        one.attach(first)
        two.attach(second)

        async def burst() -> None:  # both workers' calls sent before either 429 arrived
            await asyncio.gather(_throttle(first), _throttle(second))

        asyncio.run(burst())
        one.sync()
        two.sync()
        with make_session_factory(engine)() as db:
            row = db.execute(select(ModelLimit)).scalar_one()
            assert row.key == limit_hash(key)
            assert row.in_flight_limit == pytest.approx(INITIAL_LIMIT * DECREASE)
            assert row.throttled == 2
            stored = " ".join(str(value) for value in db.execute(select(ModelLimitDemand)).all())
        assert "example.test" not in row.key + stored and "3f2a9c0d" not in row.key + stored
        # Nothing waits on either worker: each takes half of the shared limit (the first
        # learns of the second's 429 in its next round).
        one.sync()
        assert first.shared == second.shared == (int(INITIAL_LIMIT * DECREASE), 2)
        assert first.limit == second.limit == 3

        # A 429 to a call sent after that cut is a new signal: the limit is cut again.
        asyncio.run(_throttle(first))
        one.sync()
        with make_session_factory(engine)() as db:
            again = db.execute(select(ModelLimit)).scalar_one()
            assert again.in_flight_limit == pytest.approx(INITIAL_LIMIT * DECREASE**2)
    finally:
        one.close()
        two.close()
        engine.dispose()


def test_the_limit_is_split_by_demand_and_what_nobody_wants_is_split_evenly():
    assert fair_share(20, {"a": 128, "b": 128}, "a") == 10
    assert fair_share(20, {"a": 4, "b": 128}, "b") == 16
    assert fair_share(20, {"a": 4, "b": 128}, "a") == 4
    assert fair_share(20, {"a": 2, "b": 4}, "a") == 2 + 14 / 2
    assert fair_share(20, {"a": 0}, "a") == 20


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_platform_runs_on_one_key_pass_every_attempt_sharing_one_limit(
    tmp_path, databases: Databases
):
    rows = 40
    with FakeModelServer(rate_limit=RATE, latency=0.2, retry_after=1.0) as model:
        server = Server.start(tmp_path / "platform", model, databases=databases)
        try:
            repo = make_repo(
                tmp_path / "ws",
                [row("pass", a, 3) for a in range(2, 2 + rows)],
                limit=rows,
                batch_size=32,  # max_in_flight: far above what 20 calls/s allow
                env={"MAX_CONCURRENT": "32"},
            )
            upload_dataset(server, repo)
            with server.client() as client:
                ids = [submit(client, repo).id for _ in range(2)]  # both run at once
                runs = [finished(client, run_id, timeout=240) for run_id in ids]
            for run in runs:
                assert run.eval_run.status == "finished"
                assert (run.summary.passed, run.summary.failed) == (rows, 0)
            bridges = [(run.metrics or {})["eval_run"]["bridge"] for run in runs]
            assert all(bridge["adaptive_limit"] is not None for bridge in bridges)
            engine = make_engine(databases.url(server.home))
            try:
                with make_session_factory(engine)() as db:
                    # One limit for the key both runs used, its 429s theirs, and no worker's
                    # demand left behind once they ended.
                    (shared,) = db.execute(select(ModelLimit)).scalars().all()
                    assert shared.throttled == sum(b["throttled_calls"] for b in bridges)
                    assert db.execute(select(ModelLimitDemand)).all() == []
            finally:
                engine.dispose()
        finally:
            server.stop()
