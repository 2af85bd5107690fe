"""What OpenTelemetry tracing costs a run (issue 29.3): the same `osmosis eval run` untraced
and traced (six spans an attempt, to a file), alternating, in one invocation.

    .venv/bin/python bench/tracing.py [--attempts 1000] [--concurrency 32] [--repeat 3]

Prints each run's wall time and the ratio traced / untraced (medians), with the machine's
load average beside it: two shared cores make single figures noisy, so read the ratio.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, bench/ comes first on sys.path, and bench/platform.py would shadow the
# standard library's `platform` (which aiohttp, httpx and uuid import).
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# ruff: noqa: E402

import argparse
import os
import statistics
import subprocess
import tempfile
import time

from tests.e2e.conftest import CLI, model_env
from tests.e2e.workspace import make_workspace, row

from osmosis.testing import FakeModelServer


def _run(workspace: Path, config: Path, name: str, env: dict[str, str]) -> float:
    started = time.monotonic()
    done = subprocess.run(
        [*CLI, "eval", "run", str(config), "--name", name, "-y"],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode != 0:
        raise SystemExit(f"eval run {name} failed:\n{done.stderr[-3000:]}")
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rows = [row("pass", 2 + i % 50, 3 + i // 50) for i in range(args.attempts)]
    with tempfile.TemporaryDirectory() as scratch, FakeModelServer() as model:
        root = Path(scratch)
        config = make_workspace(root, rows, limit=args.attempts, batch_size=args.concurrency)
        plain = model_env(model, MAX_CONCURRENT=str(args.concurrency))
        spans = root / "spans.jsonl"
        traced = {**plain, "OSMOSIS_OTEL_EXPORTER": f"file:{spans}"}
        _run(root, config, "warm-up", plain)  # the environment and the caches, once
        times: dict[str, list[float]] = {"untraced": [], "traced": []}
        print(f"{args.attempts} attempts, concurrency {args.concurrency}, 0 ms model latency")
        for index in range(args.repeat):
            for label, env in (("untraced", plain), ("traced", traced)):
                seconds = _run(root, config, f"{label}-{index}", env)
                times[label].append(seconds)
                load = os.getloadavg()[0]
                print(f"  {label:<9} {seconds:7.2f} s   load {load:.2f}")
        lines = sum(1 for _ in spans.open()) if spans.exists() else 0
    untraced, traced_s = statistics.median(times["untraced"]), statistics.median(times["traced"])
    print(f"spans written: {lines} ({lines / max(1, args.repeat * args.attempts):.1f} an attempt)")
    print(f"traced / untraced (median wall time): {traced_s / untraced:.3f}")


if __name__ == "__main__":
    main()
