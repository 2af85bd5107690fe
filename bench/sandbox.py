"""What the rollout sandbox costs: attempts/s sandboxed vs unsandboxed, and start-up time.

    .venv/bin/python bench/sandbox.py [--attempts 1000] [--concurrency 32] [--starts 5]

1. Throughput: the same `osmosis eval run` (one model call per attempt, scripted model at 0 ms
   latency) with and without `--sandbox`, alternated `--rounds` times; attempts/s over the
   dispatch window (first attempt's start to last attempt's end, from the journal), so
   start-up is left out. Every engine <-> rollout byte then goes through the shim and every
   model call through the shim and the bridge forwarder. Aim: sandboxed >= 0.8x.
2. Start-up: `LocalProcessSite.start(1)` vs `SandboxSite.start(1)` for the same rollout
   (until `GET /health` answers), `--starts` times each: the median time the sandbox adds per
   rollout server (the namespaces, the cgroup, the mounts, the shim's interpreter).

The machine's load average is printed beside each figure: on 2 shared cores a figure taken
under a high load says more about the neighbours than about the sandbox; repeat it.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, bench/ comes first on sys.path and bench/platform.py would shadow `platform`.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]
# ruff: noqa: E402

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import tempfile
import textwrap
import time
from datetime import datetime

from osmosis.testing import FakeModelServer

ROLLOUT = """
import os
import uvicorn
from osmosis import (AgentWorkflow, AgentWorkflowConfig, ConcurrencyConfig, Grader,
                     LocalBackend, create_rollout_server)

class OneCall(AgentWorkflow):
    async def run(self, ctx):
        return [*ctx.prompt, await ctx.chat(ctx.prompt)]

class Always(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0)

app = create_rollout_server(backend=LocalBackend(
    workflow=OneCall, grader=Always,
    workflow_config=AgentWorkflowConfig(
        name="bench", concurrency=ConcurrencyConfig(max_concurrent=256)),
))

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]),
                log_level="warning", access_log=False)
"""


def make_workspace(root: Path, attempts: int, concurrency: int) -> Path:
    rows = max(4, attempts // 4)
    (root / "rollouts" / "bench").mkdir(parents=True)
    (root / "configs" / "eval").mkdir(parents=True)
    (root / "data").mkdir()
    (root / "rollouts" / "bench" / "main.py").write_text(textwrap.dedent(ROLLOUT))
    with (root / "data" / "bench.jsonl").open("w") as handle:
        for index in range(rows):
            handle.write(json.dumps({"user_prompt": f"q{index}", "ground_truth": "1"}) + "\n")
    config = root / "configs" / "eval" / "bench.toml"
    config.write_text(
        '[experiment]\nrollout = "bench"\nentrypoint = "main.py"\n'
        'model_path = "openai/fake-model"\ndataset = "bench"\n\n'
        f"[evaluation]\nn = 4\nbatch_size = {concurrency}\n"
        "agent_workflow_timeout_s = 60\ngrader_timeout_s = 60\n\n[secrets]\nrequired = []\n"
    )
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return config


def load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


def dispatch_rate(run_dir: Path) -> tuple[int, float]:
    """Attempts and attempts/s over the dispatch window, from the journal."""
    starts, ends = [], []
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        entry = json.loads(line)
        if "finished_at" not in entry:
            continue
        end = datetime.fromisoformat(entry["finished_at"]).timestamp()
        ends.append(end)
        starts.append(end - float(entry.get("duration_ms") or 0) / 1000)
    window = max(ends) - min(starts)
    return len(ends), len(ends) / window


def eval_run(workspace: Path, model: FakeModelServer, name: str, sandbox: bool) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OSMOSIS_", "OPENAI_"))}
    env.update(OPENAI_API_BASE=model.base_url, OPENAI_API_KEY="sk-bench")
    command = [sys.executable, "-c", "from osmosis.cli.main import run; run()"]
    done = subprocess.run(
        [*command, "--json", "eval", "run", "configs/eval/bench.toml", "--name", name,
         "--fresh", "--yes", *(["--sandbox"] if sandbox else [])],
        cwd=workspace, env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"eval run failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    _count, rate = dispatch_rate(workspace / ".osmosis" / "evals" / name)
    return rate


async def start_times(workspace: Path, starts: int) -> dict[str, list[float]]:
    from osmosis.eval.results.redact import Redactor
    from osmosis.eval.sites.environment import prepare_environment
    from osmosis.eval.sites.local import LocalProcessSite
    from osmosis.eval.sites.sandbox import SandboxPolicy
    from osmosis.eval.sites.sandbox.site import SandboxSite

    rollout = workspace / "rollouts" / "bench"
    environment = prepare_environment(rollout, cache_root=workspace / "envs", log=lambda _: None)
    times: dict[str, list[float]] = {"local": [], "sandbox": []}
    for index in range(starts):
        for kind in ("local", "sandbox"):
            common = {
                "env": {},
                "trials_root": workspace / "trials" / f"{kind}-{index}",
                "log": lambda _: None,
                "redactor": Redactor([]),
            }
            site: LocalProcessSite
            if kind == "local":
                site = LocalProcessSite(environment, rollout, "main.py", **common)  # type: ignore[arg-type]
            else:
                site = SandboxSite(
                    environment, rollout, "main.py", policy=SandboxPolicy(),
                    workspace=workspace, bridge_url="http://127.0.0.1:45999/v1",
                    bridge_address=("127.0.0.1", 45999), **common,  # type: ignore[arg-type]
                )  # fmt: skip
            began = time.perf_counter()
            await site.start(1)
            times[kind].append(time.perf_counter() - began)
            await site.stop()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--starts", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="osmosis-bench-sandbox-") as scratch:
        workspace = Path(scratch) / "ws"
        make_workspace(workspace, args.attempts, args.concurrency)
        rates: dict[bool, list[float]] = {False: [], True: []}
        with FakeModelServer() as model:
            for round_index in range(args.rounds):
                for sandbox in (False, True):
                    rate = eval_run(workspace, model, f"r{round_index}{int(sandbox)}", sandbox)
                    rates[sandbox].append(rate)
                    print(
                        f"  round {round_index + 1} {'sandbox' if sandbox else 'local  '}: "
                        f"{rate:7.1f} attempts/s (load {load()})",
                        flush=True,
                    )
        plain, boxed = statistics.median(rates[False]), statistics.median(rates[True])
        print(
            f"throughput, {args.attempts} attempts, concurrency {args.concurrency}, 0 ms model: "
            f"unsandboxed {plain:.1f}/s, sandboxed {boxed:.1f}/s -> {boxed / plain:.2f}x "
            f"(aim >= 0.80x)"
        )
        times = asyncio.run(start_times(workspace, args.starts))
        local, sandboxed = statistics.median(times["local"]), statistics.median(times["sandbox"])
        print(
            f"start-up per rollout server (median of {args.starts}): unsandboxed "
            f"{local * 1000:.0f} ms, sandboxed {sandboxed * 1000:.0f} ms -> the sandbox adds "
            f"{(sandboxed - local) * 1000:.0f} ms (load {load()})"
        )


if __name__ == "__main__":
    main()
