"""A provider limited to 20 calls/s: the bridge's adaptive (AIMD) limit beside fixed concurrency.

    .venv/bin/python bench/rate_limit.py [--calls 300] [--rate 20] [--latency 0.5]
    .venv/bin/python bench/rate_limit.py --platform [--database URL] [--platform-seconds 20]

The scripted model (its own thread and event loop) accepts `--rate` chat completions in any
one second and answers the rest 429 with Retry-After 1 s; each accepted call takes
`--latency` s. A load generator keeps 128 calls in flight through a bridge (one rollout id
each, as an evaluation with `max_in_flight 128` does) until `--calls` are answered; a call
the bridge answers 503 (retries exhausted: an outage) is sent again after 1 s, as the engine
re-runs an attempt.

Rows:
    fixed       the bridge without its adaptive limit: 128 calls in flight, whatever answers
    adaptive    the bridge's AIMD limit (bridge_limits), bounded by max_in_flight 128
    shared      two bridges on one key at once, each with 128 in flight, for the time the
                adaptive row took: each one's share of the calls answered

Figures: 429s adaptive vs fixed (target >= 5x fewer), throughput vs `--rate` (target within
15 %): over the adaptive row (its first burst of 128 and its tail of retried calls
included) and steady (the shared rows' second half, both bridges together), and each shared
bridge's share (target within 30 % of half).

`--platform`: two platform worker processes (`tests/platform/limit_load.py`: a bridge each,
128 in flight, as a run's worker has it) on one key, first each adapting alone, then sharing
the limit through the platform database (`DatabaseLimits`; a fresh SQLite file unless
`--database`): the 429s of both (target: sharing <= half of alone) and each worker's calls/s
after the first third (target within 30 % of half the rate).
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, bench/ comes first on sys.path, and bench/platform.py would shadow the
# standard library's `platform` (which httpx and uuid import).
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]
# ruff: noqa: E402

import argparse
import asyncio
import itertools
import json
import subprocess
import tempfile
import time
from dataclasses import dataclass

import httpx

from osmosis.eval.model.bridge import ModelBridge
from osmosis.eval.model.providers import ModelTarget
from osmosis.testing import FakeModelServer

IN_FLIGHT = 128
QUESTION = [{"role": "user", "content": "What is 17 * 23?"}]
_ids = itertools.count()


@dataclass
class Figures:
    answered: int
    seconds: float
    throttled: int
    limit: int | None

    @property
    def rate(self) -> float:
        return self.answered / self.seconds


def _bridge(model: FakeModelServer, key: str, *, adaptive: bool) -> ModelBridge:
    # A key per row: each row starts from a fresh limit (the registry is process-wide).
    target = ModelTarget(
        kind="openai-compatible", model="fake-model", api_base=model.base_url, api_key=key
    )
    return ModelBridge(target=target, max_in_flight=IN_FLIGHT, adaptive=adaptive)


async def _load(
    bridge: ModelBridge, calls: int | None, until: float | None, count_from: float = 0.0
) -> Figures:
    """128 workers, each sending one call at a time, until `calls` are answered or `until`
    (then counting the answers between `count_from` and `until` only)."""
    answered = 0
    began = max(time.monotonic(), count_from)
    headers = {"authorization": f"Bearer {bridge.token}"}

    def more() -> bool:
        if until is not None:
            return time.monotonic() < until
        return calls is not None and answered + busy < calls

    busy = 0
    async with httpx.AsyncClient(
        timeout=120, trust_env=False, limits=httpx.Limits(max_connections=IN_FLIGHT)
    ) as client:

        async def worker() -> None:
            nonlocal answered, busy
            while more():
                busy += 1
                rollout = f"r{next(_ids)}"
                url = bridge.open_rollout(rollout) + "/chat/completions"
                try:
                    while True:
                        answer = await client.post(
                            url, json={"messages": QUESTION}, headers=headers
                        )
                        if answer.status_code == 200:
                            break
                        await asyncio.sleep(1.0)  # an outage: the engine re-runs the attempt
                finally:
                    busy -= 1
                bridge.forget(rollout)
                if until is None or count_from <= time.monotonic() < until:
                    answered += 1

        await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))
    stats = bridge.stats()
    ended = time.monotonic() if until is None else until
    return Figures(answered, ended - began, stats.throttled_calls, stats.limit)


async def _row(model: FakeModelServer, key: str, *, adaptive: bool, calls: int) -> Figures:
    async with _bridge(model, key, adaptive=adaptive) as bridge:
        return await _load(bridge, calls, None)


async def _shared(model: FakeModelServer, seconds: float) -> tuple[Figures, Figures]:
    """Both bridges' answers in the second half of `seconds`: in the first, the bridge that
    queued its 128 calls first is served first (the queue is first come, first served)."""
    async with (
        _bridge(model, "shared", adaptive=True) as one,
        _bridge(model, "shared", adaptive=True) as two,
    ):
        now = time.monotonic()
        until, half = now + seconds, now + seconds / 2
        first, second = await asyncio.gather(
            _load(one, None, until, half), _load(two, None, until, half)
        )
    return first, second


def _worker_pair(
    model: FakeModelServer, key: str, seconds: float, database: str | None
) -> list[dict[str, float]]:
    start = time.time() + 3  # both import and open their bridge first
    command = [
        sys.executable, "-m", "tests.platform.limit_load", "--model", model.base_url,
        "--key", key, "--start", str(start), "--seconds", str(seconds),
        "--count-from", str(seconds / 3), "--in-flight", str(IN_FLIGHT),
    ]  # fmt: skip
    if database is not None:
        command += ["--database", database]
    root = Path(__file__).resolve().parents[1]
    workers = [
        subprocess.Popen(command, cwd=root, stdout=subprocess.PIPE, text=True) for _ in range(2)
    ]
    return [json.loads(worker.communicate()[0].splitlines()[-1]) for worker in workers]


def platform(args: argparse.Namespace) -> None:
    from osmosis.platform.core.db import make_engine, upgrade

    database = args.database
    if database is None:
        database = f"sqlite:///{tempfile.mkdtemp(prefix='rate-limit-')}/platform.db"
        engine = make_engine(database)
        upgrade(engine)
        engine.dispose()
    seconds = args.platform_seconds
    with FakeModelServer(rate_limit=args.rate, latency=args.latency, retry_after=1.0) as model:
        alone = _worker_pair(model, "platform-alone", seconds, None)
        shared = _worker_pair(model, "platform-shared", seconds, database)
    print(f"provider: {args.rate:g} calls/s, {args.latency:g} s a call; 2 workers x {IN_FLIGHT}")
    print(f"{'row':<10} {'calls/s':>8} {'share':>6} {'429s':>6} {'limit':>6} {'global':>7}")
    for name, pair in (("alone", alone), ("shared", shared)):
        total = sum(worker["answered"] for worker in pair) or 1
        for index, worker in enumerate(pair, 1):
            rate = worker["answered"] / worker["seconds"]
            glob = worker["shared"][0] if worker["shared"] else "-"
            print(
                f"{name}-{index:<4} {rate:>8.1f} {worker['answered'] / total:>6.2f} "
                f"{worker['throttled']:>6} {worker['limit']:>6} {glob:>7}"
            )
    throttled_alone = sum(worker["throttled"] for worker in alone)
    throttled_shared = sum(worker["throttled"] for worker in shared)
    fewer = throttled_alone / max(throttled_shared, 1)
    print(f"429s alone/shared: {fewer:.1f}x fewer when shared (target >= 2x)")
    half = args.rate / 2
    rates = ", ".join(f"{w['answered'] / w['seconds'] / half:.2f}" for w in shared)
    print(f"shared workers' calls/s / half of {args.rate:g}: {rates} (target 0.7-1.3)")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--shared-seconds", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--latency", type=float, default=0.5)
    parser.add_argument("--platform", action="store_true", help="two worker processes")
    parser.add_argument("--platform-seconds", type=float, default=30.0)
    parser.add_argument("--database", help="the platform database (default: a new SQLite)")
    args = parser.parse_args()
    if args.platform:
        await asyncio.to_thread(platform, args)
        return
    with FakeModelServer(rate_limit=args.rate, latency=args.latency, retry_after=1.0) as model:
        fixed = await _row(model, "fixed", adaptive=False, calls=args.calls)
        adaptive = await _row(model, "adaptive", adaptive=True, calls=args.calls)
        one, two = await _shared(model, args.shared_seconds)
    print(f"provider: {args.rate:g} calls/s, {args.latency:g} s a call; {IN_FLIGHT} in flight")
    print(f"{'row':<10} {'calls':>6} {'seconds':>8} {'calls/s':>8} {'429s':>6} {'limit':>6}")
    for name, row in (
        ("fixed", fixed),
        ("adaptive", adaptive),
        ("shared-1", one),
        ("shared-2", two),
    ):
        print(
            f"{name:<10} {row.answered:>6} {row.seconds:>8.1f} {row.rate:>8.1f} "
            f"{row.throttled:>6} {row.limit if row.limit is not None else '-':>6}"
        )
    fewer = fixed.throttled / max(adaptive.throttled, 1)
    share = one.answered / max(one.answered + two.answered, 1)
    print(f"429s fixed/adaptive: {fewer:.1f}x fewer (target >= 5x)")
    ratio = adaptive.rate / args.rate
    steady = (one.answered + two.answered) / one.seconds / args.rate
    print(f"adaptive throughput / {args.rate:g} calls/s: {ratio:.2f} whole run, ramp and tail")
    print(f"  steady (both shared bridges, second half): {steady:.2f} (target >= 0.85)")
    print(f"shared: first {share:.2f}, second {1 - share:.2f} of the calls (target 0.35-0.65)")


if __name__ == "__main__":
    asyncio.run(main())
