"""What the rollout sandbox costs: attempts/s sandboxed vs unsandboxed, and start-up time.

    .venv/bin/python bench/sandbox.py [--attempts 1000] [--concurrency 32] [--starts 5]

1. Throughput: the same `osmosis eval run` (one model call per attempt, scripted model at 0 ms
   latency) with and without `--sandbox`, alternated `--rounds` times; attempts/s over the
   dispatch window (first attempt's start to last attempt's end, from the journal), so
   start-up is left out. Every connection, engine -> rollout and rollout -> bridge, is then
   made by the shim and handed over (SCM_RIGHTS): its bytes no longer pass through any
   process in between. Target (issue 30): sandboxed >= 0.95x.
   Beside it, CPU ms per attempt of each process (the engine, the shim, the rollout server),
   between the 10th and the 90th percentile of recorded attempts: steadier than attempts/s
   on shared cores, and it says which process the sandbox's cost lands on.
2. Start-up: `LocalProcessSite.start(1)` vs `SandboxSite.start(1)` for the same rollout
   (until `GET /health` answers), `--starts` times each: the median time the sandbox adds per
   rollout server (the namespaces, the cgroup, the mounts, the shim's interpreter). Beside
   it, the CPU the start took (the engine's, and that of every process of the server alive
   once it answers: bwrap, the shim, the rollout), which a neighbour's load bends less.

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
import threading
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


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_below(root: int) -> dict[int, float]:
    """CPU seconds so far of `root` and every process below it."""
    table: dict[int, tuple[int, float]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        table[int(stat.parent.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK)
    inside, grew = {root}, True
    while grew:
        more = {pid for pid, (parent, _) in table.items() if parent in inside} - inside
        inside |= more
        grew = bool(more)
    return {pid: table[pid][1] for pid in inside if pid in table}


def _kind(pid: int, engine: int) -> str:
    if pid == engine:
        return "engine"
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "other"
    return "shim" if b"shim.py" in command else "rollout" if b"main.py" in command else "other"


def eval_run(
    workspace: Path, model: FakeModelServer, name: str, sandbox: bool
) -> tuple[float, dict[str, float]]:
    """attempts/s over the dispatch window, and CPU ms per attempt by process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OSMOSIS_", "OPENAI_"))}
    env.update(OPENAI_API_BASE=model.base_url, OPENAI_API_KEY="sk-bench")
    command = [sys.executable, "-c", "from osmosis.cli.main import run; run()"]
    process = subprocess.Popen(
        [*command, "--json", "eval", "run", "configs/eval/bench.toml", "--name", name,
         "--fresh", "--yes", *(["--sandbox"] if sandbox else [])],
        cwd=workspace, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    journal = workspace / ".osmosis" / "evals" / name / "events.jsonl"
    samples: list[tuple[int, dict[str, float]]] = []
    stop = threading.Event()

    def watch() -> None:
        last: dict[int, float] = {}
        kinds: dict[int, str] = {}
        while not stop.is_set():
            for pid, cpu in _cpu_below(process.pid).items():
                last[pid] = cpu  # an exited process keeps its last reading
                # Each time: a child the shim forked shows the shim's command until it execs.
                kind = _kind(pid, process.pid)
                if kind != "other" or pid not in kinds:
                    kinds[pid] = kind
            try:
                recorded = journal.read_bytes().count(b"\n")
            except OSError:
                recorded = 0
            by_kind: dict[str, float] = {}
            for pid, cpu in last.items():
                by_kind[kinds[pid]] = by_kind.get(kinds[pid], 0.0) + cpu
            samples.append((recorded, by_kind))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    out, err = process.communicate(timeout=1800)
    stop.set()
    watcher.join()
    if process.returncode != 0:
        raise SystemExit(f"eval run failed:\n{out[-2000:]}\n{err[-2000:]}")
    count, rate = dispatch_rate(workspace / ".osmosis" / "evals" / name)
    low = next(s for s in samples if s[0] >= count * 0.1)
    high = next((s for s in samples if s[0] >= count * 0.9), samples[-1])
    done = max(high[0] - low[0], 1)
    cpu = {k: (v - low[1].get(k, 0.0)) * 1000 / done for k, v in high[1].items()}
    return rate, {k: v for k, v in cpu.items() if v >= 0.01}


async def start_times(
    workspace: Path, starts: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Seconds until each server answered, and the CPU seconds its start took, by kind."""
    from osmosis.eval.results.redact import Redactor
    from osmosis.eval.sites.environment import prepare_environment
    from osmosis.eval.sites.local import LocalProcessSite
    from osmosis.eval.sites.sandbox import SandboxPolicy
    from osmosis.eval.sites.sandbox.site import SandboxSite

    rollout = workspace / "rollouts" / "bench"
    environment = prepare_environment(rollout, cache_root=workspace / "envs", log=lambda _: None)
    times: dict[str, list[float]] = {"local": [], "sandbox": []}
    cpu: dict[str, list[float]] = {"local": [], "sandbox": []}
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
            began, began_cpu = time.perf_counter(), time.process_time()
            await site.start(1)
            times[kind].append(time.perf_counter() - began)
            children = sum(c for p, c in _cpu_below(os.getpid()).items() if p != os.getpid())
            cpu[kind].append(time.process_time() - began_cpu + children)
            await site.stop()
    return times, cpu


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
        cpus: dict[bool, list[float]] = {False: [], True: []}
        with FakeModelServer() as model:
            for round_index in range(args.rounds):
                # ABBA: which side goes first alternates, so a trend in the machine's speed
                # over the rounds (warming caches, neighbours' load) falls on both alike.
                for sandbox in (False, True) if round_index % 2 == 0 else (True, False):
                    name = f"r{round_index}{int(sandbox)}"
                    rate, cpu = eval_run(workspace, model, name, sandbox)
                    rates[sandbox].append(rate)
                    cpus[sandbox].append(sum(cpu.values()))
                    shares = ", ".join(f"{k} {v:.2f}" for k, v in sorted(cpu.items()))
                    print(
                        f"  round {round_index + 1} {'sandbox' if sandbox else 'local  '}: "
                        f"{rate:7.1f} attempts/s, CPU ms/attempt {shares} (load {load()})",
                        flush=True,
                    )
        plain, boxed = statistics.median(rates[False]), statistics.median(rates[True])
        rounds = [b / p for p, b in zip(rates[False], rates[True], strict=True)]
        # The headline is the median of each round's own ratio: the two runs of a round meet
        # the same machine, medians taken side by side may come from different rounds.
        print(
            f"throughput, {args.attempts} attempts, concurrency {args.concurrency}, 0 ms model: "
            f"sandboxed / unsandboxed {statistics.median(rounds):.2f}x per round, median "
            f"(target >= 0.95x); round by round {' '.join(f'{r:.2f}x' for r in rounds)}; "
            f"medians unsandboxed {plain:.1f}/s, sandboxed {boxed:.1f}/s -> {boxed / plain:.2f}x"
        )
        plain_cpu, boxed_cpu = statistics.median(cpus[False]), statistics.median(cpus[True])
        print(
            f"CPU per attempt, all processes (median): unsandboxed {plain_cpu:.2f} ms, "
            f"sandboxed {boxed_cpu:.2f} ms -> {boxed_cpu / plain_cpu:.2f}x"
        )
        times, cpu = asyncio.run(start_times(workspace, args.starts))
        local, sandboxed = statistics.median(times["local"]), statistics.median(times["sandbox"])
        print(
            f"start-up per rollout server (median of {args.starts}): unsandboxed "
            f"{local * 1000:.0f} ms, sandboxed {sandboxed * 1000:.0f} ms -> the sandbox adds "
            f"{(sandboxed - local) * 1000:.0f} ms (target <= 50 ms; load {load()})"
        )
        local, sandboxed = statistics.median(cpu["local"]), statistics.median(cpu["sandbox"])
        print(
            f"start-up CPU per rollout server (median): unsandboxed {local * 1000:.0f} ms, "
            f"sandboxed {sandboxed * 1000:.0f} ms -> the sandbox adds "
            f"{(sandboxed - local) * 1000:.0f} ms of CPU"
        )


if __name__ == "__main__":
    main()
