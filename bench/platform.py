"""Attempts/s and wall time of an evaluation run on the platform versus `osmosis eval run`.

    .venv/bin/python bench/platform.py [--cases dispatch,wall] [--attempts 1000]
                                       [--wall-rows 500] [--concurrency 64] [--repeat 1]

Both sides use the same workspace, config (batch_size = concurrency), dataset and scripted
model (zero latency), measured in this one invocation, one after the other, `--repeat` times
(alternating, so the neighbours' load falls on both alike; medians with the range):

  dispatch  attempts/s of an `--attempts`-row run, from each run's own journal
            (`events.jsonl` `finished_at` stamps): start-up (server, clone, venv, rollout
            server) is left out of both alike. Target: platform / local >= 0.9 (issue 30).
  wall      the wall time of a `--wall-rows`-row run with its environment cached: `eval run`'s
            whole command against `eval submit` → the run finished (its `completed_at`).
            Target: platform / local <= 1.3 (issue 30).

The platform's rollout server runs in the sandbox (its default), `eval run`'s does not: the
sandbox's per-attempt accounting is part of the platform's figure. Each run starts once the
platform's processes are quiet (`settle`: a run's worker, the warm spare it leaves behind), so
neither side pays for what the other left running. The load average is printed: 2 shared
cores.
"""

from __future__ import annotations

import sys
from pathlib import Path

# This file is named like the standard library's `platform`: keep its directory off the
# import path before anything imports the real one.
HERE = Path(__file__).resolve().parent
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != HERE]

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from datetime import datetime  # noqa: E402

from osmosis.client import PlatformClient  # noqa: E402
from osmosis.testing import FakeModelServer  # noqa: E402
from osmosis.vocabulary import TERMINAL_RUN_STATUSES  # noqa: E402

CLI = [sys.executable, "-c", "from osmosis.cli.main import run; run()"]
ROLLOUT = (HERE / "engine.py").read_text().split('ROLLOUT = """', 1)[1].split('"""', 1)[0]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def osmosis(*args: str, cwd: Path, env: dict[str, str]) -> str:
    result = subprocess.run([*CLI, *args], cwd=cwd, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"osmosis {' '.join(args)} failed:\n{result.stderr[-2000:]}")
    return result.stdout


def git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def make_workspace(root: Path, attempts: int, concurrency: int, wall_rows: int = 0) -> Path:
    """A pushed git workspace: the engine bench's one-call rollout, `attempts` rows;
    `configs/eval/bench.toml` runs them all, `wall.toml` the first `wall_rows` (when > 0)."""
    tree = root / "workspace"
    (tree / "rollouts" / "bench").mkdir(parents=True)
    (tree / "configs" / "eval").mkdir(parents=True)
    (tree / "data").mkdir()
    (tree / "rollouts" / "bench" / "main.py").write_text(ROLLOUT)
    with (tree / "data" / "bench.jsonl").open("w") as handle:
        for index in range(max(attempts, wall_rows)):
            a, b = index % 97 + 2, index % 89 + 3
            row = {"user_prompt": f"What is {a} * {b}?", "ground_truth": str(a * b)}
            handle.write(json.dumps(row) + "\n")
    configs = {"bench": attempts, **({"wall": wall_rows} if wall_rows > 0 else {})}
    for config, limit in configs.items():
        (tree / "configs" / "eval" / f"{config}.toml").write_text(
            '[experiment]\nrollout = "bench"\nentrypoint = "main.py"\n'
            'model_path = "openai/fake-model"\ndataset = "bench"\n\n'
            f"[evaluation]\nlimit = {limit}\nbatch_size = {concurrency}\n"
            "agent_workflow_timeout_s = 120\ngrader_timeout_s = 30\n\n[secrets]\nrequired = []\n"
        )
    origin = root / "origin.git"
    git("init", "-q", "--bare", "-b", "main", str(origin), cwd=root)
    git("init", "-q", "-b", "main", cwd=tree)
    git("add", "-A", cwd=tree)
    git("-c", "user.name=bench", "-c", "user.email=b@localhost", "commit", "-qm", "x", cwd=tree)
    git("remote", "add", "origin", str(origin), cwd=tree)
    git("push", "-q", "-u", "origin", "main", cwd=tree)
    return tree


def tree_cpu_s(root: int) -> float:
    """CPU seconds used so far by process `root` and its live descendants (from /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    used: dict[int, float] = {}
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        pid = int(entry.name)
        used[pid] = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
        children.setdefault(int(fields[1]), []).append(pid)
    total, stack = 0.0, [root]
    while stack:
        pid = stack.pop()
        total += used.get(pid, 0.0)
        stack.extend(children.get(pid, []))
    return total


def settle(
    server_pid: int, *, share: float = 0.05, window_s: float = 0.3, limit_s: float = 30.0
) -> None:
    """Wait until the platform's processes use under `share` of a core over `window_s`: what a
    run left working (its warm spare importing the engine) would otherwise slow the next run
    of either side."""
    deadline = time.monotonic() + limit_s
    last = tree_cpu_s(server_pid)
    while time.monotonic() < deadline:
        time.sleep(window_s)
        now = tree_cpu_s(server_pid)
        if now - last < share * window_s:
            return
        last = now


def stamps(journal: Path) -> list[float]:
    """When each attempt was recorded (epoch seconds), in order."""
    return sorted(
        datetime.fromisoformat(json.loads(line)["finished_at"]).timestamp()
        for line in journal.read_text().splitlines()
    )


def throughput(journal: Path) -> tuple[int, float]:
    ends = stamps(journal)
    span = ends[-1] - ends[0]
    return len(ends), (len(ends) - 1) / span if span > 0 else float("nan")


@dataclass
class Run:
    """One run of either side: its attempts, their rate, its whole wall time, pass rate."""

    attempts: int
    rate: float
    wall_s: float
    pass_rate: float | None
    phases: dict[str, float]
    """Where the wall time went, in order (seconds)."""


def local_run(tree: Path, env: dict[str, str], *, config: str, name: str) -> Run:
    began = time.time()
    out = osmosis("--json", "eval", "run", f"configs/eval/{config}.toml", "--name", name, "-y",
                  cwd=tree, env=env)  # fmt: skip
    ended = time.time()
    journal = tree / ".osmosis" / "evals" / name / "events.jsonl"
    attempts, rate = throughput(journal)
    ends = stamps(journal)
    phases = {"to first record": ends[0] - began, "attempts": ends[-1] - ends[0],
              "to exit": ended - ends[-1]}  # fmt: skip
    metrics = json.loads(out)["resource"]["metrics"]
    return Run(attempts, rate, ended - began, metrics["pass_rate"], phases)


def platform_run(tree: Path, env: dict[str, str], client: PlatformClient, *, config: str) -> Run:
    began = time.time()
    submitted = json.loads(
        osmosis("--json", "eval", "submit", f"configs/eval/{config}.toml", "-y", cwd=tree, env=env)
    )
    submit_s = time.time() - began
    name = submitted["resource"]["name"]
    # Polled through the typed client in this process, seldom: a CLI process per poll would
    # take CPU from the run being measured on a small machine. The wall time is the run's own
    # `completed_at` (the server's clock: this machine's), not the poll's.
    while (detail := client.runs.get(name)).eval_run.status not in TERMINAL_RUN_STATUSES:
        time.sleep(1.0)
    if detail.eval_run.status != "finished":
        raise SystemExit(
            f"platform run {name} ended {detail.eval_run.status}: {detail.eval_run.error}"
        )
    assert detail.metrics is not None
    completed = detail.eval_run.completed_at
    ended = completed.timestamp() if completed is not None else time.time()
    journal = Path(env["OSMOSIS_HOME"]) / "runs" / detail.eval_run.id / "events.jsonl"
    attempts, rate = throughput(journal)
    ends = stamps(journal)
    started = detail.eval_run.started_at
    claimed = started.timestamp() if started is not None else began + submit_s
    phases = {"submit command": submit_s, "to claim": claimed - began - submit_s,
              "to first record": ends[0] - claimed, "attempts": ends[-1] - ends[0],
              "to finished": ended - ends[-1]}  # fmt: skip
    return Run(attempts, rate, ended - began, detail.metrics["summary"]["pass_rate"], phases)


def figure(values: list[float], unit: str = "") -> str:
    """The median, with the range when there are several."""
    middle = f"{statistics.median(values):.2f}{unit}"
    if len(values) == 1:
        return middle
    return f"{middle} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="dispatch,wall", help="dispatch, wall or both")
    parser.add_argument("--attempts", type=int, default=1000)
    parser.add_argument("--wall-rows", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=1, help="runs of each side, alternating")
    args = parser.parse_args()
    cases = [case.strip() for case in args.cases.split(",") if case.strip()]
    unknown = sorted(set(cases) - {"dispatch", "wall"})
    if unknown or not cases:
        parser.error(f"--cases: unknown {', '.join(unknown) or '(none)'}; use dispatch, wall")
    if args.repeat < 1 or args.attempts < 2 or args.wall_rows < 1:
        parser.error("--repeat and --wall-rows must be >= 1, --attempts >= 2")
    runs: dict[tuple[str, str], list[Run]] = {}
    with FakeModelServer() as model, tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        tree = make_workspace(root, args.attempts, args.concurrency, args.wall_rows)
        env = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS_")}
        env.update(
            OPENAI_API_BASE=model.base_url,
            OPENAI_API_KEY="sk-bench",
            OSMOSIS_HOME=str(root / "home"),
            OSMOSIS_CONFIG_DIR=str(root / "config"),
        )
        osmosis("server", "start", "--detach", "--port", str(free_port()), cwd=root, env=env)
        try:
            osmosis("dataset", "upload", "data/bench.jsonl", "-y", cwd=tree, env=env)
            credentials = json.loads((root / "home" / "credentials.json").read_text())
            server_pid = int(json.loads((root / "home" / "server.json").read_text())["pid"])
            with PlatformClient(credentials["platform_url"], credentials["token"]) as client:
                # Wall times are taken with each side's environment built: the dispatch
                # case's first runs build them, or else one untimed run of each does.
                plan = cases if "dispatch" in cases else ["warm", *cases]
                for index in range(args.repeat):
                    for case in plan if index == 0 else cases:
                        config = "wall" if case != "dispatch" else "bench"
                        name = f"{case}-{index}"
                        settle(server_pid)
                        here = local_run(tree, env, config=config, name=name)
                        settle(server_pid)
                        there = platform_run(tree, env, client, config=config)
                        runs.setdefault((case, "local"), []).append(here)
                        runs.setdefault((case, "platform"), []).append(there)
        finally:
            osmosis("server", "stop", cwd=root, env=env)
    print(f"scripted model, 0 latency, concurrency {args.concurrency}, {args.repeat} run(s) each")
    if "dispatch" in cases:
        local, remote = runs["dispatch", "local"], runs["dispatch", "platform"]
        ratios = [b.rate / a.rate for a, b in zip(local, remote, strict=True)]
        print(f"dispatch: {args.attempts} attempts")
        print(f"  {'osmosis eval run attempts/s':<38}{figure([r.rate for r in local]):>22}")
        print(f"  {'platform run attempts/s':<38}{figure([r.rate for r in remote]):>22}")
        print(f"  {'platform / local':<38}{figure(ratios, 'x'):>22}   (target >= 0.90)")
        same = {r.pass_rate for r in local + remote}
        print(f"  {'same pass rate':<38}{len(same) == 1!s:>22}")
    if "wall" in cases:
        local, remote = runs["wall", "local"], runs["wall", "platform"]
        ratios = [b.wall_s / a.wall_s for a, b in zip(local, remote, strict=True)]
        print(f"wall: {args.wall_rows} rows, environment cached")
        whole = figure([r.wall_s for r in local], " s")
        print(f"  {'osmosis eval run, whole command':<38}{whole:>22}")
        print(
            f"  {'platform, submit -> finished':<38}{figure([r.wall_s for r in remote], ' s'):>22}"
        )
        print(f"  {'platform / local':<38}{figure(ratios, 'x'):>22}   (target <= 1.30)")
        for side, measured in (("eval run", local), ("platform", remote)):
            names = measured[0].phases
            split = ", ".join(
                f"{name} {statistics.median(r.phases[name] for r in measured):.2f}"
                for name in names
            )
            print(f"    {side} phases (s): {split}")
        same_runs = {(r.attempts, r.pass_rate) for r in local + remote}
        print(f"  {'same attempts and pass rate':<38}{len(same_runs) == 1!s:>22}")
    print(f"{'load average at the end (2 cores)':<40}{os.getloadavg()[0]:>20.2f}")


if __name__ == "__main__":
    main()
