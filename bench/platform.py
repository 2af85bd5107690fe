"""Attempts/s of an evaluation run on the platform versus `osmosis eval run`, same workload.

    .venv/bin/python bench/platform.py [--attempts 1000] [--concurrency 64]

Both runs use the same workspace, config (batch_size = concurrency), dataset and scripted
model (zero latency), measured in this one invocation. Throughput is taken from each run's own
journal (`events.jsonl` `finished_at` stamps), so start-up (server, clone, venv, rollout server)
is left out of both alike. Target: platform / local >= 0.9 (issue 30). The platform's rollout
server runs in the sandbox (its default), `eval run`'s does not: the sandbox's per-attempt
accounting is part of the platform's figure. The load average is printed: 2 shared cores.
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
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
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


def make_workspace(root: Path, attempts: int, concurrency: int) -> Path:
    """A pushed git workspace: the engine bench's one-call rollout, `attempts` rows."""
    tree = root / "workspace"
    (tree / "rollouts" / "bench").mkdir(parents=True)
    (tree / "configs" / "eval").mkdir(parents=True)
    (tree / "data").mkdir()
    (tree / "rollouts" / "bench" / "main.py").write_text(ROLLOUT)
    with (tree / "data" / "bench.jsonl").open("w") as handle:
        for index in range(attempts):
            a, b = index % 97 + 2, index % 89 + 3
            row = {"user_prompt": f"What is {a} * {b}?", "ground_truth": str(a * b)}
            handle.write(json.dumps(row) + "\n")
    (tree / "configs" / "eval" / "bench.toml").write_text(
        '[experiment]\nrollout = "bench"\nentrypoint = "main.py"\n'
        'model_path = "openai/fake-model"\ndataset = "bench"\n\n'
        f"[evaluation]\nlimit = {attempts}\nbatch_size = {concurrency}\n"
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


def throughput(journal: Path) -> tuple[int, float]:
    stamps = sorted(
        datetime.fromisoformat(json.loads(line)["finished_at"])
        for line in journal.read_text().splitlines()
    )
    span = (stamps[-1] - stamps[0]).total_seconds()
    return len(stamps), (len(stamps) - 1) / span if span > 0 else float("nan")


def local_run(tree: Path, env: dict[str, str]) -> tuple[int, float, dict]:
    out = osmosis("--json", "eval", "run", "configs/eval/bench.toml", "--name", "local", "-y",
                  cwd=tree, env=env)  # fmt: skip
    attempts, rate = throughput(tree / ".osmosis" / "evals" / "local" / "events.jsonl")
    return attempts, rate, json.loads(out)["resource"]["metrics"]


def platform_run(tree: Path, env: dict[str, str]) -> tuple[int, float, dict]:
    osmosis("dataset", "upload", "data/bench.jsonl", "-y", cwd=tree, env=env)
    submitted = json.loads(
        osmosis("--json", "eval", "submit", "configs/eval/bench.toml", "-y", cwd=tree, env=env)
    )
    name = submitted["resource"]["name"]
    # Polled through the typed client in this process: a CLI process per poll would take
    # CPU from the run being measured on a small machine.
    credentials = json.loads((Path(env["OSMOSIS_HOME"]) / "credentials.json").read_text())
    with PlatformClient(credentials["platform_url"], credentials["token"]) as client:
        while (detail := client.runs.get(name)).eval_run.status not in TERMINAL_RUN_STATUSES:
            time.sleep(1.0)
    if detail.eval_run.status != "finished":
        raise SystemExit(
            f"platform run {name} ended {detail.eval_run.status}: {detail.eval_run.error}"
        )
    assert detail.metrics is not None
    journal = Path(env["OSMOSIS_HOME"]) / "runs" / detail.eval_run.id / "events.jsonl"
    attempts, rate = throughput(journal)
    return attempts, rate, detail.metrics["summary"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    with FakeModelServer() as model, tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        tree = make_workspace(root, args.attempts, args.concurrency)
        env = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS_")}
        env.update(
            OPENAI_API_BASE=model.base_url,
            OPENAI_API_KEY="sk-bench",
            OSMOSIS_HOME=str(root / "home"),
            OSMOSIS_CONFIG_DIR=str(root / "config"),
        )
        local_attempts, local_rate, local_metrics = local_run(tree, env)
        osmosis("server", "start", "--detach", "--port", str(free_port()), cwd=root, env=env)
        try:
            remote_attempts, remote_rate, remote_metrics = platform_run(tree, env)
        finally:
            osmosis("server", "stop", cwd=root, env=env)
    print(f"{args.attempts} attempts, concurrency {args.concurrency}, scripted model, 0 latency")
    print(f"{'osmosis eval run attempts/s':<40}{local_rate:>10.1f}   ({local_attempts} attempts)")
    print(f"{'platform run attempts/s':<40}{remote_rate:>10.1f}   ({remote_attempts} attempts)")
    print(f"{'platform / local':<40}{remote_rate / local_rate:>10.2f}   (target >= 0.90)")
    same = local_metrics["pass_rate"] == remote_metrics["pass_rate"]
    print(f"{'same pass rate':<40}{same!s:>10}")
    print(f"{'load average at the end (2 cores)':<40}{os.getloadavg()[0]:>10.2f}")


if __name__ == "__main__":
    main()
