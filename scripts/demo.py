"""`make demo`: the platform workflow end to end, on this machine, with no account and no key.

1. start the embedded platform (fresh home under `.demo/`) on a free loopback port;
2. copy `examples/workspace` into a git repository whose `origin` is a local bare repository,
   and push it (the platform clones the pushed commit, as it would from GitHub);
3. upload `data/add.jsonl`, submit `configs/eval/add.toml` (one-digit sums, 4 attempts per row,
   on the local SmolLM2 model), follow it to the end;
4. print `osmosis eval info`, the headline numbers (pass rate, pass@1 against pass@4, wall
   time), and download everything under `.osmosis/evals/<run>/`.

The server is stopped at the end; its data stays in `.demo/home`
(`OSMOSIS_HOME=.demo/home osmosis server start` serves it again, dashboard included).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEMO = Path(os.environ.get("OSMOSIS_DEMO_DIR", REPO / ".demo")).resolve()
OSMOSIS = [sys.executable, "-c", "from osmosis.cli.main import run; run()"]
TERMINAL = {"finished", "failed", "stopped"}
CONFIG = "configs/eval/add.toml"
DATASET = "data/add.jsonl"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run(*args: str, cwd: Path, env: dict[str, str], capture: bool = False) -> str:
    """Run a command; on failure print what it said and stop the demo."""
    result = subprocess.run(args, cwd=cwd, env=env, text=True, capture_output=capture)
    if result.returncode != 0:
        if capture:
            sys.stderr.write(result.stdout + result.stderr)
        raise SystemExit(
            f"demo: `{' '.join(args[3:] if args[0] == sys.executable else args)}` "
            f"failed with exit code {result.returncode}"
        )
    return result.stdout if capture else ""


def osmosis(*args: str, cwd: Path, env: dict[str, str], capture: bool = False) -> str:
    return run(*OSMOSIS, *args, cwd=cwd, env=env, capture=capture)


def git(*args: str, cwd: Path, env: dict[str, str]) -> None:
    run("git", *args, cwd=cwd, env=env, capture=True)


def make_workspace(env: dict[str, str]) -> Path:
    workspace, origin = DEMO / "workspace", DEMO / "origin.git"
    shutil.copytree(REPO / "examples" / "workspace", workspace)
    git("init", "-q", "--bare", "-b", "main", str(origin), cwd=DEMO, env=env)
    git("init", "-q", "-b", "main", cwd=workspace, env=env)
    git("add", "-A", cwd=workspace, env=env)
    git("commit", "-q", "-m", "example workspace", cwd=workspace, env=env)
    git("remote", "add", "origin", str(origin), cwd=workspace, env=env)
    git("push", "-q", "-u", "origin", "main", cwd=workspace, env=env)
    return workspace


def follow(name: str, workspace: Path, env: dict[str, str]) -> str:
    """Poll `eval info` until the run ends, printing progress as it changes."""
    shown = None
    while True:
        info = json.loads(
            osmosis("--json", "eval", "info", name, cwd=workspace, env=env, capture=True)
        )["data"]
        status = info["eval_run"]["status"]
        progress = info["summary"]["progress"]
        line = f"  {status}: {progress['completed']} / {progress['total']} samples"
        if line != shown:
            print(line, flush=True)
            shown = line
        if status in TERMINAL:
            return str(status)
        time.sleep(1)


def headline(name: str, workspace: Path, env: dict[str, str], seconds: float) -> str:
    """The numbers the demo is for, from `eval info --json`: pass rate and pass@k."""
    info = json.loads(osmosis("--json", "eval", "info", name, cwd=workspace, env=env, capture=True))
    results = info["data"]["results"]
    at = {int(p["k"]): float(p["value"]) for p in results.get("pass_at_k") or []}
    shown = " · ".join(f"pass@{k} {value:.1%}" for k, value in sorted(at.items()))
    return (
        f"pass rate {results['pass_rate']:.1%} ({results['passed']}/{results['graded']} "
        f"attempts) · {shown} · {seconds:.0f} s wall time"
    )


def main() -> int:
    began = time.monotonic()
    shutil.rmtree(DEMO, ignore_errors=True)
    DEMO.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS_")}
    env.update(
        OSMOSIS_HOME=str(DEMO / "home"),
        OSMOSIS_CONFIG_DIR=str(DEMO / "config"),
        GIT_AUTHOR_NAME="osmosis demo",
        GIT_AUTHOR_EMAIL="demo@localhost",
        GIT_COMMITTER_NAME="osmosis demo",
        GIT_COMMITTER_EMAIL="demo@localhost",
    )
    workspace = make_workspace(env)
    print(f"== starting the platform (home {DEMO / 'home'})", flush=True)
    osmosis("server", "start", "--detach", "--port", str(free_port()), cwd=DEMO, env=env)
    try:
        print(f"== uploading {DATASET}", flush=True)
        osmosis("dataset", "upload", DATASET, "-y", cwd=workspace, env=env)
        print(f"== submitting {CONFIG} (local SmolLM2 model, 4 attempts per row)", flush=True)
        submitted = json.loads(
            osmosis(
                "--json",
                "eval",
                "submit",
                CONFIG,
                "-y",
                cwd=workspace,
                env=env,
                capture=True,
            )
        )
        name = submitted["resource"]["name"]
        print(f"== following {name}", flush=True)
        status = follow(name, workspace, env)
        osmosis("eval", "info", name, cwd=workspace, env=env)
        osmosis("eval", "download", name, "--type", "all", "-y", cwd=workspace, env=env)
        print(f"\nDownloaded to {workspace / '.osmosis' / 'evals' / name}")
        if status == "finished":
            print(f"== {name}: {headline(name, workspace, env, time.monotonic() - began)}")
        return 0 if status == "finished" else 1
    finally:
        osmosis("server", "stop", cwd=DEMO, env=env, capture=True)


if __name__ == "__main__":
    sys.exit(main())
