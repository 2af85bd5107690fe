"""Render time of the dashboard's runs page and samples page over a run of 10,000 attempts.

    .venv/bin/python bench/dashboard.py [--attempts 10000] [--runs 200] [--repeat 5]

Seeds a temporary platform home (one run of `--attempts` attempts, 4 per row, beside `--runs`
other runs), starts the real server on a free loopback port, and times whole HTTP requests
(signed in with the bearer token) for each page: median and slowest of `--repeat`, after one
warm-up. Target: under 1 s each. Pages read one LIMIT/OFFSET page of attempts, never all.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, bench/ comes first on sys.path, and bench/platform.py would shadow the
# standard library's `platform` (which httpx needs through click and uuid).
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]
# ruff: noqa: E402

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import tempfile
import time
from datetime import UTC, datetime, timedelta

import httpx
from sqlalchemy import insert

from osmosis.eval.metrics import summarize
from osmosis.platform import Settings, create_app
from osmosis.platform.db.models import User, Workspace, WorkspaceMember, new_id
from osmosis.platform.db.run_models import EvalAttempt, EvalRun
from osmosis.platform.run_sink import refresh_counters

CLI = [sys.executable, "-c", "from osmosis.cli.main import run; run()"]
T0 = datetime(2026, 11, 1, tzinfo=UTC)
N = 4


def _run(workspace: Workspace, user: User, *, name: str, minutes: int, rows: int) -> EvalRun:
    evaluation = {"limit": rows, "n": N, "batch_size": 8, "pass_threshold": 1.0}
    return EvalRun(
        id=new_id(),
        name=name,
        workspace_id=workspace.id,
        created_by=user.id,
        status="finished",
        created_at=T0 + timedelta(minutes=minutes),
        payload="{}",
        config=json.dumps({"evaluation": evaluation, "advanced": {}, "env": {}}),
        config_toml="",
        config_path="configs/eval/bench.toml",
        rollout=random.choice(["alpha", "beta"]),
        entrypoint="main.py",
        model_path=random.choice(["openai/gpt-a", "openai/gpt-b"]),
        dataset_name=random.choice(["math", "code"]),
        origin_url="file:///bench.git",
        commit_sha="0" * 40,
        secret_scopes="{}",
        total=rows * N,
        dataset_rows=rows,
    )


def seed(home: Path, *, attempts: int, runs: int) -> str:
    rng = random.Random(7)
    app = create_app(Settings(home=home))
    with app.state.sessions() as db:
        admin = db.query(User).one()
        workspace = Workspace(identity="bench/ws", created_by=admin.id, created_at=T0)
        db.add(workspace)
        db.add(WorkspaceMember(workspace=workspace, user_id=admin.id, role="owner"))
        db.flush()
        for i in range(runs):
            db.add(_run(workspace, admin, name=f"other-{i:04d}", minutes=i, rows=1))
        big = _run(workspace, admin, name="big", minutes=runs + 1, rows=attempts // N)
        db.add(big)
        db.flush()
        values = []
        for slot in range(attempts):
            failed = rng.random() < 0.05
            values.append(
                {
                    "run_id": big.id,
                    "row_index": slot // N,
                    "run_index": slot % N,
                    "rollout_id": new_id(),
                    "status": "failed" if failed else "success",
                    "reward": None if failed else round(rng.random(), 3),
                    "tokens": rng.randint(100, 4000),
                    "duration_ms": rng.uniform(200, 20_000),
                    "error_type": "timeout" if failed else None,
                    "cost_usd": 0.001,
                    "finished_at": T0,
                }
            )
        db.execute(insert(EvalAttempt), values)
        refresh_counters(db, run_id=big.id, pass_threshold=1.0)
        rows = [type("A", (), {**v, "cost_usd": v["cost_usd"]})() for v in values]
        summary = summarize(rows, pass_threshold=1.0)
        big.summary = json.dumps({"eval_run": {"id": big.id}, "summary": summary})
        # The same attempts in a run still going: its page computes results live, from every
        # attempt recorded so far, at each refresh.
        live = _run(workspace, admin, name="live", minutes=runs + 2, rows=attempts // N)
        live.status = "running"
        db.add(live)
        db.flush()
        db.execute(insert(EvalAttempt), [{**v, "run_id": live.id} for v in values])
        refresh_counters(db, run_id=live.id, pass_threshold=1.0)
        db.commit()
    app.state.engine.dispose()
    return "big"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def timed(client: httpx.Client, path: str, repeat: int) -> list[float]:
    client.get(path).raise_for_status()  # warm-up: imports, template compile, SQLite cache
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        response = client.get(path)
        times.append(time.perf_counter() - start)
        response.raise_for_status()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        started = time.perf_counter()
        name = seed(home, attempts=args.attempts, runs=args.runs)
        print(
            f"seeded {args.attempts:,} attempts + {args.runs} runs in "
            f"{time.perf_counter() - started:.1f} s"
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS_")}
        env.update(OSMOSIS_HOME=str(home), OSMOSIS_CONFIG_DIR=str(Path(tmp) / "config"))
        port = free_port()
        subprocess.run(
            [*CLI, "server", "start", "--detach", "--port", str(port)],
            env=env,
            check=True,
            capture_output=True,
        )
        try:
            token = json.loads((home / "credentials.json").read_text())["token"]
            headers = {"Authorization": f"Bearer {token}", "Accept": "text/html"}
            pages = {
                "runs page (/)": "/",
                "runs page, filtered + page 3": "/?status=finished&dataset=math&offset=50",
                "samples page": f"/runs/{name}/samples",
                "samples by -duration, page 41": (
                    f"/runs/{name}/samples?sort=-duration_ms&offset=2000"
                ),
                "samples, failed only": f"/runs/{name}/samples?failed=1",
                "samples, reward 0.2-0.4": f"/runs/{name}/samples?min_reward=0.2&max_reward=0.4",
                "run page": f"/runs/{name}",
                "run page of a running run (live results)": "/runs/live",
            }
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers) as client:
                print(f"{'page':44} {'median':>9} {'slowest':>9}")
                for label, path in pages.items():
                    times = timed(client, path, args.repeat)
                    print(
                        f"{label:44} {statistics.median(times) * 1000:7.0f} ms "
                        f"{max(times) * 1000:7.0f} ms"
                    )
        finally:
            subprocess.run([*CLI, "server", "stop"], env=env, capture_output=True)


if __name__ == "__main__":
    main()
