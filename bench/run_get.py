"""Server CPU and wall time of one `GET` of a run (issue 30): what `osmosis eval info`,
`eval submit --wait`, the official CLI's polling and the dashboard ask many times a second.

    .venv/bin/python bench/run_get.py [--requests 300] [--sizes 0,1000,10000]

Seeds a temporary platform home (bench/dashboard.py's runs: 4 attempts per row, 5 % failed)
with a finished run of each `--sizes` attempts and a running one of the largest, starts the
real server (`osmosis server start --detach`) and sends `--requests` GETs of each route, one
after the other on one connection. Server CPU is the server process's utime + stime
(/proc/<pid>/stat, every thread) before and after; wall is the client's. The limit beside each
figure is measured in the same run: `GET /api/health` (no token, no database), and the ratio
says how many health checks one GET of the run costs. The load average is printed: 2 shared
cores.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, bench/ comes first on sys.path, and bench/platform.py would shadow the
# standard library's `platform`.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
# ruff: noqa: E402

import argparse
import importlib.util
import json
import os
import subprocess
import tempfile
import time
from types import ModuleType

import httpx
from sqlalchemy import insert

from osmosis.eval.results.metrics import summarize
from osmosis.platform import Settings, create_app
from osmosis.platform.core.db.models import User, Workspace, WorkspaceMember
from osmosis.platform.core.db.run_models import EvalAttempt
from osmosis.platform.worker.run_sink import refresh_counters

CLI = [sys.executable, "-c", "from osmosis.cli.main import run; run()"]
TICK = os.sysconf("SC_CLK_TCK")


def _dashboard() -> ModuleType:
    """bench/dashboard.py, for its seeded runs and attempts (one definition of both)."""
    spec = importlib.util.spec_from_file_location("bench_dashboard", HERE / "dashboard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def seed(home: Path, sizes: list[int]) -> list[str]:
    """A finished run `finished-<n>` per size and `running-<largest>`; returns their names."""
    dash = _dashboard()
    app = create_app(Settings(home=home))
    names = []
    with app.state.sessions() as db:
        admin = db.query(User).one()
        workspace = Workspace(identity="bench/ws", created_by=admin.id, created_at=dash.T0)
        db.add(workspace)
        db.add(WorkspaceMember(workspace=workspace, user_id=admin.id, role="owner"))
        db.flush()
        cases = [(f"finished-{n}", n, "finished") for n in sizes]
        cases.append((f"running-{max(sizes)}", max(sizes), "running"))
        for minutes, (name, count, status) in enumerate(cases):
            run = dash._run(workspace, admin, name=name, minutes=minutes, rows=max(count // 4, 1))
            run.status = status
            db.add(run)
            db.flush()
            values = dash.attempts(count, minutes)
            if values:
                db.execute(insert(EvalAttempt), [{**v, "run_id": run.id} for v in values])
            refresh_counters(db, run_id=run.id, pass_threshold=1.0)
            if status == "finished":
                summary = summarize(values, pass_threshold=1.0)
                run.summary = json.dumps({"eval_run": {"id": run.id}, "summary": summary})
            dash.write_run_files(home / "runs" / run.id, values, trajectories=False)
            names.append(name)
        db.commit()
    app.state.engine.dispose()
    return names


def cpu_seconds(pid: int) -> float:
    # Fields 14 and 15 (utime, stime) after the command name, which may hold spaces.
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def measure(client: httpx.Client, pid: int, path: str, count: int) -> tuple[float, float]:
    """Server CPU ms and wall ms per GET of `path` over `count` GETs (after 20 to warm up)."""
    for _ in range(20):
        client.get(path).raise_for_status()
    cpu, start = cpu_seconds(pid), time.perf_counter()
    for _ in range(count):
        client.get(path).raise_for_status()
    wall = time.perf_counter() - start
    return (cpu_seconds(pid) - cpu) * 1000 / count, wall * 1000 / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--sizes", default="0,1000,10000")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        names = seed(home, sizes)
        env = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS_")}
        env.update(OSMOSIS_HOME=str(home), OSMOSIS_CONFIG_DIR=str(Path(tmp) / "config"))
        env["OSMOSIS_ROLE"] = "api"  # no worker: the running run stays as seeded
        port = _dashboard().free_port()
        subprocess.run(
            [*CLI, "server", "start", "--detach", "--port", str(port)],
            env=env,
            check=True,
            capture_output=True,
        )
        try:
            pid = int((home / "server.pid").read_text().split()[0])
            token = json.loads((home / "credentials.json").read_text())["token"]
            headers = {"Authorization": f"Bearer {token}"}
            base = f"http://127.0.0.1:{port}"
            with httpx.Client(base_url=base, headers=headers, timeout=120) as client:
                health_cpu, health_wall = measure(client, pid, "/api/health", args.requests)
                print(f"load average {os.getloadavg()[0]:.2f}; {args.requests} GETs per line")
                print(f"{'route':46} {'cpu/GET':>10} {'wall/GET':>10} {'cpu x health':>13}")
                print(
                    f"{'GET /api/health (the limit)':46} {health_cpu:7.2f} ms "
                    f"{health_wall:7.2f} ms {1.0:12.1f}x"
                )
                for name in names:
                    for label, path in (
                        ("ours", f"/api/eval-runs/{name}"),
                        ("official", f"/api/cli/eval-runs/{name}"),
                        ("official metrics", f"/api/cli/eval-runs/{name}/metrics"),
                    ):
                        cpu, wall = measure(client, pid, path, args.requests)
                        ratio = cpu / health_cpu if health_cpu else float("inf")
                        print(
                            f"{label + ' ' + name:46} {cpu:7.2f} ms {wall:7.2f} ms {ratio:12.1f}x"
                        )
        finally:
            subprocess.run([*CLI, "server", "stop"], env=env, capture_output=True)


if __name__ == "__main__":
    main()
