"""Throughput and memory of the whole engine (`osmosis eval run`) against the scripted model.

    .venv/bin/python bench/engine.py [--attempts 1000] [--concurrency 64] [--sample]

Prints, from one run:
- attempts/s through the engine (CLI process, rollout server, bridge, model server) at the
  given concurrency, against the same number of model calls made directly with aiohttp at the
  same concurrency (the limit: a workflow cannot be faster than its one model call);
- the engine process's peak RSS for datasets of 1,000 and 100,000 rows (same attempt count),
  and with --sample also for the default 10 % sample of 100,000 rows (10,000 attempts).
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
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from datetime import datetime
from pathlib import Path

import aiohttp

from osmosis.testing import FakeModelServer

ROLLOUT = """
import os
import uvicorn
from osmosis import (AgentWorkflow, AgentWorkflowConfig, ConcurrencyConfig, Grader,
                     LocalBackend, create_rollout_server)

class OneCall(AgentWorkflow):
    async def run(self, ctx):
        return [*ctx.prompt, await ctx.chat(ctx.prompt)]

class Exact(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0 if ctx.label in ctx.sample.messages[-1]["content"] else 0.0)

app = create_rollout_server(
    backend=LocalBackend(workflow=OneCall, grader=Exact, workflow_config=AgentWorkflowConfig(
        name="bench", concurrency=ConcurrencyConfig(max_concurrent=256))),
    configure_logging=False,
)
if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]),
                log_level="warning", access_log=False)
"""


def make_workspace(root: Path, rows: int, limit: int | None) -> Path:
    (root / "rollouts" / "bench").mkdir(parents=True)
    (root / "configs" / "eval").mkdir(parents=True)
    (root / "data").mkdir()
    (root / "rollouts" / "bench" / "main.py").write_text(textwrap.dedent(ROLLOUT))
    with (root / "data" / "bench.jsonl").open("w") as handle:
        for index in range(rows):
            a, b = index % 97 + 2, index % 89 + 3
            handle.write(
                json.dumps({"user_prompt": f"What is {a} * {b}?", "ground_truth": str(a * b)})
                + "\n"
            )
    limit_line = f"limit = {limit}\n" if limit else ""
    config = root / "configs" / "eval" / "bench.toml"
    config.write_text(
        '[experiment]\nrollout = "bench"\nentrypoint = "main.py"\n'
        'model_path = "openai/fake-model"\ndataset = "bench"\n\n'
        f"[evaluation]\n{limit_line}agent_workflow_timeout_s = 120\ngrader_timeout_s = 30\n\n"
        "[secrets]\nrequired = []\n"
    )
    return config


def peak_rss_mib(pid: int, stop: threading.Event, peak: list[int]) -> None:
    """Poll VmHWM (the kernel's own peak-RSS counter) of the engine process until it exits."""
    while not stop.is_set():
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak[0] = max(peak[0], int(line.split()[1]))
        except OSError:
            return
        time.sleep(0.05)


def run_engine(model: FakeModelServer, rows: int, limit: int | None, concurrency: int) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        config = make_workspace(Path(scratch), rows, limit)
        env = {**os.environ, "OPENAI_API_BASE": model.base_url, "OPENAI_API_KEY": "sk-bench"}
        command = [
            sys.executable,
            "-c",
            "from osmosis.cli.main import run; run()",
            "eval",
            "run",
            str(config),
            "--name",
            "bench",
            "-y",
            "--json",
            "--max-in-flight",
            str(concurrency),
        ]
        process = subprocess.Popen(
            command, cwd=scratch, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        stop, peak = threading.Event(), [0]
        watcher = threading.Thread(target=peak_rss_mib, args=(process.pid, stop, peak))
        watcher.start()
        out, err = process.communicate()
        stop.set()
        watcher.join()
        if process.returncode != 0:
            raise SystemExit(f"eval run failed ({process.returncode}):\n{err[-2000:]}")
        journal = Path(scratch) / ".osmosis" / "evals" / "bench" / "events.jsonl"
        stamps = sorted(
            datetime.fromisoformat(json.loads(line)["finished_at"])
            for line in journal.read_text().splitlines()
        )
        span = (stamps[-1] - stamps[0]).total_seconds()
        attempts = len(stamps)
        metrics = json.loads(out)["resource"]["metrics"]
        return {
            "attempts": attempts,
            "attempts_per_s": (attempts - 1) / span if span > 0 else float("nan"),
            "peak_rss_mib": peak[0] / 1024,
            "pass_rate": metrics["pass_rate"],
        }


async def direct_calls(model: FakeModelServer, calls: int, concurrency: int) -> float:
    """The limit: the same chat completions straight to the model server with aiohttp (the
    client the bridge itself uses), at the same concurrency."""
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as client:
        counter = iter(range(calls))

        async def worker() -> None:
            for index in counter:
                body = {
                    "model": "fake-model",
                    "messages": [{"role": "user", "content": f"What is {index % 97} * 3?"}],
                }
                async with client.post(model.base_url + "/chat/completions", json=body) as reply:
                    reply.raise_for_status()
                    await reply.read()

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return calls / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument(
        "--sample",
        action="store_true",
        help="also run the 10 %% sample of 100,000 rows (10,000 attempts)",
    )
    args = parser.parse_args()
    with FakeModelServer() as model:
        direct = asyncio.run(direct_calls(model, args.attempts, args.concurrency))
        small = run_engine(model, 1_000, args.attempts, args.concurrency)
        large = run_engine(model, 100_000, args.attempts, args.concurrency)
        sampled = run_engine(model, 100_000, None, args.concurrency) if args.sample else None
    print(f"concurrency {args.concurrency}, {args.attempts} attempts, scripted model, 0 latency")
    print(f"{'direct aiohttp model calls/s (limit)':<46}{direct:>10.1f}")
    print(
        f"{'engine attempts/s, 1,000-row dataset':<46}{small['attempts_per_s']:>10.1f}"
        f"   ({small['attempts_per_s'] / direct:.2f}x the limit)"
    )
    print(f"{'engine attempts/s, 100,000-row dataset':<46}{large['attempts_per_s']:>10.1f}")
    print(f"{'engine peak RSS MiB, 1,000 rows':<46}{small['peak_rss_mib']:>10.1f}")
    print(
        f"{'engine peak RSS MiB, 100,000 rows':<46}{large['peak_rss_mib']:>10.1f}"
        f"   ({large['peak_rss_mib'] / small['peak_rss_mib']:.2f}x)"
    )
    if sampled:
        print(
            f"{'engine peak RSS MiB, 10 % of 100,000 rows':<46}"
            f"{sampled['peak_rss_mib']:>10.1f}   ({sampled['attempts']} attempts, "
            f"{sampled['peak_rss_mib'] / small['peak_rss_mib']:.2f}x)"
        )
        print(f"{'engine attempts/s, 10,000 attempts':<46}{sampled['attempts_per_s']:>10.1f}")


if __name__ == "__main__":
    main()
