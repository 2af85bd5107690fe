"""Calls per second through the model bridge, beside direct calls to the same fake model.

    .venv/bin/python bench/bridge.py [--seconds 5] [--concurrency 64] [--no-litellm]

Three processes: the scripted fake model, the bridge (when measured), and this load generator,
which keeps `--concurrency` chat completions in flight (one rollout id each) over one pooled
aiohttp session and counts answers after a short warm-up. Nothing is pinned to a CPU: on a
2-core machine the three share the cores as the engine, the bridge and a local model would.

Rows:
    direct        the load generator posts straight to the fake model
    direct-httpx  the same load from one pooled httpx.AsyncClient: why the bridge's direct
                  path does not use httpx (its pool degrades as calls in flight grow)
    bridge        through the bridge's direct (httpx) path: model pinned, rules checked,
                  usage and cost counted, every call recorded
    bridge-stream the same with stream=true (emulated SSE)
    litellm       through the bridge with the model routed through LiteLLM instead

The ratio bridge/direct is the share of the load generator's throughput the bridge keeps;
the engine needs at least 100 attempts/s end to end. Beside it, the bridge process's CPU per
answer (from /proc), steadier than the rate on 2 shared cores. The bridge runs as in the
engine: on its event loop, its start-up heap frozen, each rollout's calls taken as it ends.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, bench/ comes first on sys.path, and bench/platform.py would shadow the
# standard library's `platform` (which aiohttp, httpx and uuid import).
_BENCH = Path(__file__).parent.resolve()
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _BENCH]
sys.path.insert(0, str(_BENCH.parent))  # bench/engine.py, imported as a module
# ruff: noqa: E402

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp
import httpx
from bench.engine import cpu_seconds

WARMUP_SECONDS = 1.0
QUESTION = [{"role": "user", "content": "What is 17 * 23?"}]


# -- servers (each in a child process) -------------------------------------------------------
async def _serve_fake() -> None:
    from osmosis.testing import FakeModelServer

    fake = await FakeModelServer().start_async()
    print(fake.base_url, flush=True)
    await asyncio.Event().wait()


async def _serve_bridge(fake_url: str, kind: str) -> None:
    from osmosis.eval.model.bridge import ModelBridge
    from osmosis.eval.model.providers import resolve_model

    target = resolve_model(
        "openai/bench-model",
        {"OPENAI_API_BASE": fake_url},
        force_litellm=kind == "litellm",
    )
    bridge = ModelBridge(target=target)
    await bridge.start()
    # The bridge serves only rollouts it was told of (the engine opens each one it dispatches):
    # open the load generator's ids, one per call in flight.
    for index in range(4096):
        bridge.open_rollout(f"r{index}")
    bridge.open_rollout("warmup")
    if kind == "litellm":  # import LiteLLM and warm its client before the clock starts
        async with httpx.AsyncClient() as client:
            await client.post(
                bridge.rollout_url("warmup") + "/chat/completions",
                json={"model": "x", "messages": QUESTION},
                headers={"authorization": f"Bearer {bridge.token}"},
                timeout=120,
            )
    gc.freeze()  # as the engine does before its first dispatch (host/frozen_heap.py)
    print(bridge.base_url, bridge.token, flush=True)
    while True:  # until terminated: each rollout's calls taken, as the engine does as it ends
        await asyncio.sleep(0.05)
        for index in range(4096):
            bridge.take_calls(f"r{index}")


def _spawn(*args: str) -> tuple[subprocess.Popen[str], list[str]]:
    process = subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    line = process.stdout.readline().split()
    if not line:
        process.wait()
        raise RuntimeError(f"{' '.join(args)} did not start")
    return process, line


# -- load generator --------------------------------------------------------------------------
@dataclass
class _Tally:
    done: int = 0
    failed: int = 0
    counting: bool = False


@dataclass
class Measured:
    rate: float  # answers per second
    failed: int
    cpu_us: float | None  # the bridge process's CPU per answer, when one was watched


async def _drive(
    post: Callable[[str], Awaitable[int]],
    url: str,
    seconds: float,
    concurrency: int,
    bridge_pid: int | None = None,
) -> Measured:
    """Keep `concurrency` calls in flight (one rollout id each) and count answers, and the
    CPU the bridge process spent meanwhile."""
    tally = _Tally()
    stop = asyncio.Event()

    async def worker(index: int) -> None:
        target = url.format(rollout=f"r{index}")
        while not stop.is_set():
            status = await post(target)
            if tally.counting:
                tally.done += 1
                tally.failed += status != 200

    workers = [asyncio.create_task(worker(i)) for i in range(concurrency)]
    await asyncio.sleep(WARMUP_SECONDS)
    tally.counting = True
    started = time.perf_counter()
    cpu_before = cpu_seconds(bridge_pid) if bridge_pid else None
    await asyncio.sleep(seconds)
    tally.counting = False
    elapsed = time.perf_counter() - started
    cpu_after = cpu_seconds(bridge_pid) if bridge_pid else None
    cpu_us = None
    if cpu_before is not None and cpu_after is not None:
        cpu_us = (cpu_after - cpu_before) * 1e6 / max(tally.done, 1)
    stop.set()
    await asyncio.gather(*workers)
    return Measured(tally.done / elapsed, tally.failed, cpu_us)


def _body(stream: bool) -> bytes:
    return json.dumps({"model": "bench", "messages": QUESTION, "stream": stream}).encode()


async def _load(
    url: str,
    token: str | None,
    seconds: float,
    concurrency: int,
    stream: bool = False,
    bridge_pid: int | None = None,
) -> Measured:
    """The load generator the rows share: aiohttp, cheap enough not to be the bottleneck."""
    body = _body(stream)
    headers = {"content-type": "application/json"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:

        async def post(target: str) -> int:
            async with session.post(target, data=body) as response:
                await response.read()
                return response.status

        return await _drive(post, url, seconds, concurrency, bridge_pid)


async def _load_httpx(url: str, seconds: float, concurrency: int) -> Measured:
    """The same load from one pooled httpx client, for comparison."""
    body = _body(False)
    headers = {"content-type": "application/json"}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=60, trust_env=False) as client:

        async def post(target: str) -> int:
            response = await client.post(target, content=body, headers=headers)
            return response.status_code

        return await _drive(post, url, seconds, concurrency)


def _row(name: str, measured: Measured, direct: float | None) -> None:
    rate = measured.rate
    ratio = f"  {rate / direct:6.0%} of direct" if direct else ""
    cpu = f"  {measured.cpu_us:5.0f} us of bridge CPU a call" if measured.cpu_us else ""
    note = f"  ({measured.failed} answers were not 200!)" if measured.failed else ""
    print(f"{name:<14} {rate:>8,.0f} calls/s{ratio}{cpu}{note}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per row")
    parser.add_argument("--concurrency", type=int, default=64, help="calls kept in flight")
    parser.add_argument("--no-litellm", action="store_true", help="skip the LiteLLM row")
    parser.add_argument("--serve-fake", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--serve-bridge", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.serve_fake:
        asyncio.run(_serve_fake())
        return
    if args.serve_bridge:
        from osmosis.eval.host import event_loop  # the engine's loop: uvloop where installed

        event_loop.run(_serve_bridge(*args.serve_bridge))
        return

    print(f"{args.concurrency} calls in flight, {args.seconds:g} s per row, {os.cpu_count()} CPUs")
    fake, (fake_url,) = _spawn("--serve-fake")
    try:
        fake_chat = fake_url + "/chat/completions"
        measured = asyncio.run(_load(fake_chat, None, args.seconds, args.concurrency))
        _row("direct", measured, None)
        direct = measured.rate
        _row(
            "direct-httpx",
            asyncio.run(_load_httpx(fake_chat, args.seconds, args.concurrency)),
            direct,
        )
        kinds = ["direct"] if args.no_litellm else ["direct", "litellm"]
        for kind in kinds:
            bridge, (bridge_url, token) = _spawn("--serve-bridge", fake_url, kind)
            try:
                url = bridge_url + "/rollouts/{rollout}/chat/completions"
                streams = (False, True) if kind == "direct" else (False,)
                for stream in streams:
                    measured = asyncio.run(
                        _load(url, token, args.seconds, args.concurrency, stream, bridge.pid)
                    )
                    name = "litellm" if kind == "litellm" else "bridge"
                    _row(name + ("-stream" if stream else ""), measured, direct)
            finally:
                bridge.terminate()
                bridge.wait()
    finally:
        fake.terminate()
        fake.wait()


if __name__ == "__main__":
    main()
