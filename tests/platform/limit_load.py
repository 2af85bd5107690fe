"""One worker process's model traffic, for the shared-limit test and bench: a bridge with
`max_in_flight` calls kept in flight against one provider key, with or without the limit
shared through the platform database (`DatabaseLimits`), as a platform run's worker has it.

    python -m tests.platform.limit_load --model URL --key KEY --start EPOCH --seconds 10 \
        [--database URL]     # share the limit through this database; without: adapt alone

Prints one JSON line: calls answered between `--count-from` s after the start and the end,
the 429s this process saw, its limit at the end and the global one (shared only).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time

import httpx

from osmosis.eval.model.bridge import ModelBridge
from osmosis.eval.model.bridge_limits import install_coordinator, limit_key, shared_limit
from osmosis.eval.model.providers import ModelTarget
from osmosis.platform.core.db import make_engine
from osmosis.platform.worker.model_limits import DatabaseLimits

QUESTION = [{"role": "user", "content": "What is 17 * 23?"}]


async def _load(
    bridge: ModelBridge, in_flight: int, begin: float, count_from: float, end: float
) -> int:
    """`in_flight` clients, each sending one call at a time until `end` (wall clock); the
    calls answered after `count_from`. A 503 (the bridge's retries ran out) is sent again
    after 1 s, as the engine re-runs an attempt."""
    ids = itertools.count()
    answered = 0
    headers = {"authorization": f"Bearer {bridge.token}"}
    await asyncio.sleep(max(0.0, begin - time.time()))
    async with httpx.AsyncClient(
        timeout=120, trust_env=False, limits=httpx.Limits(max_connections=in_flight)
    ) as client:

        async def one() -> None:
            nonlocal answered
            while True:
                rollout = f"r{next(ids)}"
                url = bridge.open_rollout(rollout) + "/chat/completions"
                try:
                    while True:
                        answer = await client.post(
                            url, json={"messages": QUESTION}, headers=headers
                        )
                        if answer.status_code == 200:
                            if count_from <= time.time() < end:
                                answered += 1
                            break
                        await asyncio.sleep(1.0)
                finally:
                    bridge.forget(rollout)  # at the end: its call leaves the queue too

        clients = [asyncio.create_task(one()) for _ in range(in_flight)]
        await asyncio.sleep(max(0.0, end - time.time()))
        for task in clients:
            task.cancel()
        await asyncio.gather(*clients, return_exceptions=True)
    return answered


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--start", type=float, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--count-from", type=float, default=0.0)
    parser.add_argument("--in-flight", type=int, default=128)
    parser.add_argument("--database")
    args = parser.parse_args()
    coordinator = None
    engine = None
    if args.database:
        engine = make_engine(args.database)
        coordinator = DatabaseLimits(engine)
        install_coordinator(coordinator)
    target = ModelTarget(
        kind="openai-compatible", model="fake-model", api_base=args.model, api_key=args.key
    )
    end = args.start + args.seconds
    try:
        async with ModelBridge(target=target, max_in_flight=args.in_flight) as bridge:
            answered = await _load(
                bridge, args.in_flight, args.start, args.start + args.count_from, end
            )
            stats = bridge.stats()
            shared = shared_limit(limit_key(target)).shared  # before the coordinator leaves
    finally:
        if coordinator is not None:
            install_coordinator(None)
            coordinator.close()
        if engine is not None:
            engine.dispose()
    figures = {
        "answered": answered,
        "seconds": args.seconds - args.count_from,
        "throttled": stats.throttled_calls,
        "limit": stats.limit,
        "shared": list(shared) if shared is not None else None,
    }
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
