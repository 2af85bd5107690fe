"""Start-up time, generation speed and memory of the local model server (local/smollm2-135m).

    .venv/bin/python bench/local_model.py [--starts 2] [--tokens 64] [--parallel 1]
        [--threads N] [--concurrency 1]

Rows:
    start-up      seconds from `start()` until `GET /health` answers (median of --starts)
    stop          seconds `stop()` takes, until the child has exited
    generate      one request of --tokens tokens (ignore_eos): wall time, tokens/s seen by
                  the client, and the server's own decode and prompt rates
    concurrent    --concurrency such requests at once: tokens/s summed over all of them
    rss           the child's resident memory after the requests, and its peak

It shares the machine's cores with whatever else runs: on a busy 2-core machine llama.cpp's
spinning threads lose much more than their share, so run it on a quiet machine and compare
figures from the same run only.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, bench/ comes first on sys.path, and bench/platform.py would shadow the
# standard library's `platform` (which aiohttp, httpx and uuid import).
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]
# ruff: noqa: E402

import argparse
import asyncio
import statistics
import time
from dataclasses import dataclass
from typing import Any

import httpx

from osmosis.eval.model.local_model import LocalModelServer

MODEL = "local/smollm2-135m"
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


@dataclass
class Generation:
    seconds: float
    completion_tokens: int
    decode_per_second: float
    prompt_per_second: float


async def generate(client: httpx.AsyncClient, server: LocalModelServer, tokens: int) -> Generation:
    body: dict[str, Any] = {
        "model": server.model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": tokens,
        "temperature": 0.7,
        "ignore_eos": True,  # llama.cpp extension: always generate exactly max_tokens
        "cache_prompt": False,  # measure prompt processing every time
    }
    started = time.perf_counter()
    response = await client.post(server.base_url + "/chat/completions", json=body)
    seconds = time.perf_counter() - started
    response.raise_for_status()
    answer = response.json()
    timings = answer.get("timings", {})
    return Generation(
        seconds=seconds,
        completion_tokens=answer["usage"]["completion_tokens"],
        decode_per_second=timings.get("predicted_per_second", 0.0),
        prompt_per_second=timings.get("prompt_per_second", 0.0),
    )


def memory_kib(pid: int) -> dict[str, int]:
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0])
    return fields


async def run(args: argparse.Namespace) -> None:
    startups, stops = [], []
    for _ in range(args.starts - 1):  # extra cold starts, measured and thrown away at once
        server = await LocalModelServer.for_model(
            MODEL, parallel=args.parallel, n_threads=args.threads
        ).start_async()
        assert server.startup_seconds is not None
        startups.append(server.startup_seconds)
        started = time.perf_counter()
        await server.stop_async()
        stops.append(time.perf_counter() - started)

    server = await LocalModelServer.for_model(
        MODEL, parallel=args.parallel, n_threads=args.threads
    ).start_async()
    assert server.startup_seconds is not None and server.pid is not None
    startups.append(server.startup_seconds)
    headers = {"Authorization": f"Bearer {server.api_key}"}
    try:
        async with httpx.AsyncClient(headers=headers, timeout=600) as client:
            await generate(client, server, 4)  # warm-up: first-request allocations
            one = await generate(client, server, args.tokens)
            many: list[Generation] = []
            concurrent_seconds = 0.0
            if args.concurrency > 1:
                started = time.perf_counter()
                many = await asyncio.gather(
                    *(generate(client, server, args.tokens) for _ in range(args.concurrency))
                )
                concurrent_seconds = time.perf_counter() - started
        memory = memory_kib(server.pid)
    finally:
        started = time.perf_counter()
        await server.stop_async()
        stops.append(time.perf_counter() - started)

    print(f"{MODEL}: n_threads={server.n_threads} n_ctx={server.n_ctx} parallel={server.parallel}")
    print(f"{'start-up':<12}{statistics.median(startups):>8.2f} s   (runs: {len(startups)})")
    print(f"{'stop':<12}{statistics.median(stops):>8.2f} s")
    print(
        f"{'generate':<12}{one.completion_tokens / one.seconds:>8.1f} tokens/s"
        f"   ({one.completion_tokens} tokens in {one.seconds:.2f} s; server: decode"
        f" {one.decode_per_second:.1f}/s, prompt {one.prompt_per_second:.1f}/s)"
    )
    if many:
        total = sum(g.completion_tokens for g in many)
        print(
            f"{'concurrent':<12}{total / concurrent_seconds:>8.1f} tokens/s"
            f"   ({args.concurrency} requests, {total} tokens in {concurrent_seconds:.2f} s)"
        )
    print(
        f"{'rss':<12}{memory['VmRSS'] / 1024:>8.0f} MiB   (peak {memory['VmHWM'] / 1024:.0f} MiB)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=2, help="cold starts to time")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per generation")
    parser.add_argument("--parallel", type=int, default=1, help="server slots")
    parser.add_argument("--threads", type=int, default=None, help="n_threads (default: cores)")
    parser.add_argument("--concurrency", type=int, default=1, help="requests at once")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
