"""A provider limited to 20 calls/s: the bridge's adaptive (AIMD) limit beside fixed concurrency.

    .venv/bin/python bench/rate_limit.py [--calls 300] [--rate 20] [--latency 0.5]

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
15 %): over the adaptive row (its ramp from 8 in flight and its tail of retried calls
included) and steady (the shared rows' second half, both bridges together), and each shared
bridge's share (target within 30 % of half).
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


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--shared-seconds", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--latency", type=float, default=0.5)
    args = parser.parse_args()
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
