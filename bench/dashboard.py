"""Render time of the dashboard's pages over runs of 10,000 attempts: on the platform, and in
`osmosis eval view` over local run directories (samples, search, CSV, compare of three runs).

    .venv/bin/python bench/dashboard.py [--attempts 10000] [--runs 200] [--repeat 5]

Seeds a temporary platform home (one run of `--attempts` attempts, 4 per row, each with a
journal line and a trajectory, beside `--runs` other runs) and a directory of three local runs
of the same size, starts the real server and the real viewer on free loopback ports, and times
whole HTTP requests for each page: the first request ("cold", where it says so) and then the
median and slowest of `--repeat`. A search's first request reads every attempt's trajectory
once; later searches scan texts held in memory. Target: under 1 s each once warm.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, bench/ comes first on sys.path, and bench/platform.py would shadow the
# standard library's `platform` (which httpx needs through click and uuid).
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]
# ruff: noqa: E402

import argparse
import hashlib
import json
import os
import random
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import insert

from osmosis.eval.results.metrics import summarize
from osmosis.platform import Settings, create_app
from osmosis.platform.core.db.models import User, Workspace, WorkspaceMember, new_id
from osmosis.platform.core.db.run_models import EvalAttempt, EvalRun
from osmosis.platform.worker.run_sink import refresh_counters

CLI = [sys.executable, "-c", "from osmosis.cli.main import run; run()"]
T0 = datetime(2026, 11, 1, tzinfo=UTC)
N = 4
WORDS = ("amber", "badger", "comet", "falcon", "glacier", "heron", "ibis", "lynx", "maple", "otter")


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


def attempts(count: int, seed: int) -> list[dict[str, Any]]:
    """Attempt columns, 5 % failed with a message, as the engine records them."""
    rng = random.Random(seed)
    values = []
    for slot in range(count):
        failed = rng.random() < 0.05
        values.append(
            {
                "row_index": slot // N,
                "run_index": slot % N,
                "rollout_id": new_id(),
                "status": "failed" if failed else "success",
                "reward": None if failed else round(rng.random(), 3),
                "tokens": rng.randint(100, 4000),
                "duration_ms": round(rng.uniform(200, 20_000), 3),
                "error_type": "timeout" if failed else None,
                "cost_usd": 0.001,
                "finished_at": T0,
            }
        )
    return values


def write_run_files(directory: Path, values: list[dict[str, Any]], *, trajectories: bool) -> None:
    """The journal (with each attempt's dataset row and error message) and, when asked, one
    trajectory per attempt whose answer names a word, as a rollout's would."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / "events.jsonl").open("w") as journal:
        for v in values:
            line = {
                "schema_version": 1,
                **{k: v[k] for k in ("row_index", "run_index", "rollout_id", "status")},
                "source_row_index": v["row_index"],
                "duration_ms": v["duration_ms"],
                "tokens": v["tokens"],
                "cost_usd": v["cost_usd"],
                "finished_at": v["finished_at"].isoformat(),
            }
            if v["status"] == "failed":
                line.update(error_type=v["error_type"], error_message="workflow exceeded 450s")
            else:
                line["reward"] = v["reward"]
            journal.write(json.dumps(line) + "\n")
    if not trajectories:
        return
    folder = directory / "trajectories"
    folder.mkdir(exist_ok=True)
    for i, v in enumerate(values):
        word = WORDS[i % len(WORDS)]
        steps = [
            {"step_id": 1, "source": "user", "message": f"Question {v['row_index']}"},
            {"step_id": 2, "source": "agent", "message": f"Attempt {i}: the {word} says 42."},
        ]
        name = f"row_{v['row_index']}_run_{v['run_index']}.json"
        (folder / name).write_text(json.dumps({"schema_version": "ATIF-v1.7", "steps": steps}))


def write_dataset(path: Path, rows: int) -> str:
    lines = (
        json.dumps({"user_prompt": f"Question {i}: what is {i} * 7?", "ground_truth": str(7 * i)})
        for i in range(rows)
    )
    path.write_text("".join(line + "\n" for line in lines))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def seed_platform(home: Path, *, count: int, runs: int) -> str:
    rng = random.Random(7)
    random.seed(7)
    app = create_app(Settings(home=home))
    with app.state.sessions() as db:
        admin = db.query(User).one()
        workspace = Workspace(identity="bench/ws", created_by=admin.id, created_at=T0)
        db.add(workspace)
        db.add(WorkspaceMember(workspace=workspace, user_id=admin.id, role="owner"))
        db.flush()
        for i in range(runs):
            db.add(_run(workspace, admin, name=f"other-{i:04d}", minutes=i, rows=1))
        big = _run(workspace, admin, name="big", minutes=runs + 1, rows=count // N)
        db.add(big)
        db.flush()
        values = attempts(count, rng.randint(0, 1000))
        db.execute(insert(EvalAttempt), [{**v, "run_id": big.id} for v in values])
        refresh_counters(db, run_id=big.id, pass_threshold=1.0)
        summary = summarize(values, pass_threshold=1.0)
        big.summary = json.dumps({"eval_run": {"id": big.id}, "summary": summary})
        write_run_files(home / "runs" / big.id, values, trajectories=True)
        # The same attempts in a run still going: its page computes results live, from every
        # attempt recorded so far, at each refresh.
        live = _run(workspace, admin, name="live", minutes=runs + 2, rows=count // N)
        live.status = "running"
        db.add(live)
        db.flush()
        db.execute(insert(EvalAttempt), [{**v, "run_id": live.id} for v in values])
        refresh_counters(db, run_id=live.id, pass_threshold=1.0)
        write_run_files(home / "runs" / live.id, values, trajectories=False)
        db.commit()
    app.state.engine.dispose()
    return "big"


def seed_local(root: Path, *, count: int) -> None:
    """Three local runs (`big`, `b2`, `b3`) of `count` attempts on one dataset file."""
    dataset = root.parent / "bench.jsonl"
    sha = write_dataset(dataset, count // N)
    for position, name in enumerate(("big", "b2", "b3")):
        directory = root / name
        values = attempts(count, position)
        write_run_files(directory, values, trajectories=name == "big")
        manifest = {
            "schema_version": 1,
            "local_run_id": new_id(),
            "run_name": name,
            "created_at": (T0 + timedelta(minutes=position)).isoformat(),
            "inputs": {
                "model_path": "openai/gpt-a",
                "dataset": {"sha256": sha, "selected_source_rows": "all"},
                "n": N,
                "pass_threshold": 1.0,
                "rollout": {"name": "alpha", "entrypoint": "main.py"},
            },
            "provenance": {"dataset_path": str(dataset), "config_path": "configs/eval/b.toml"},
        }
        (directory / "manifest.json").write_text(json.dumps(manifest))
        (directory / "progress.json").write_text(json.dumps({"total_runs": count}))
        metrics = {
            "eval_run": {"name": name, "status": "finished", "dataset_name": "bench"},
            "summary": summarize(values, pass_threshold=1.0),
        }
        (directory / "metrics.json").write_text(json.dumps(metrics, default=str))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until_up(url: str, headers: dict[str, str]) -> None:
    for _ in range(300):
        try:
            if httpx.get(url, headers=headers, timeout=5).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{url} did not come up")


def timed(client: httpx.Client, path: str, repeat: int) -> tuple[float, list[float]]:
    start = time.perf_counter()
    client.get(path).raise_for_status()  # the first request: builds indexes, reads texts
    first = time.perf_counter() - start
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        response = client.get(path)
        times.append(time.perf_counter() - start)
        response.raise_for_status()
    return first, times


def report(client: httpx.Client, pages: dict[str, str], repeat: int) -> Iterator[str]:
    yield f"{'page':50} {'first':>9} {'median':>9} {'slowest':>9}"
    for label, path in pages.items():
        first, times = timed(client, path, repeat)
        yield (
            f"{label:50} {first * 1000:7.0f} ms {statistics.median(times) * 1000:7.0f} ms "
            f"{max(times) * 1000:7.0f} ms"
        )


def sample_pages(name: str) -> dict[str, str]:
    samples = f"/runs/{name}/samples"
    return {
        "samples by row (first page)": samples,
        "samples by -duration, page 41": f"{samples}?sort=-duration_ms&offset=2000",
        "samples, failed only": f"{samples}?failed=1",
        "samples, reward 0.2-0.4": f"{samples}?min_reward=0.2&max_reward=0.4",
        "search one word (first: reads every output)": f"{samples}?q=otter",
        "search a phrase and a word, every attempt": f'{samples}?q="the+heron"+42&view=attempts',
        "search, no match": f"{samples}?q=zebra",
        "CSV of a search (a tenth of the attempts)": f"/runs/{name}/samples.csv?q=otter",
        "CSV of every attempt": f"/runs/{name}/samples.csv",
        "sample page, prev/next within a search": f"{samples}/1250/2?q=otter",
        "run page": f"/runs/{name}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        evals = Path(tmp) / "ws" / ".osmosis" / "evals"
        evals.mkdir(parents=True)
        started = time.perf_counter()
        name = seed_platform(home, count=args.attempts, runs=args.runs)
        seed_local(evals, count=args.attempts)
        print(
            f"seeded {args.attempts:,} attempts (+ {args.runs} runs) on the platform and 3 x "
            f"{args.attempts:,} locally in {time.perf_counter() - started:.1f} s"
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS_")}
        env.update(OSMOSIS_HOME=str(home), OSMOSIS_CONFIG_DIR=str(Path(tmp) / "config"))
        port, view_port = free_port(), free_port()
        subprocess.run(
            [*CLI, "server", "start", "--detach", "--port", str(port)],
            env=env,
            check=True,
            capture_output=True,
        )
        viewer = subprocess.Popen(
            [*CLI, "eval", "view", str(evals), "--port", str(view_port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            token = json.loads((home / "credentials.json").read_text())["token"]
            headers = {"Authorization": f"Bearer {token}", "Accept": "text/html"}
            platform_pages = {
                "runs page (/)": "/",
                "runs page, filtered + page 3": "/?status=finished&dataset=math&offset=50",
                **sample_pages(name),
                "run page of a running run (live results)": "/runs/live",
            }
            base = f"http://127.0.0.1:{port}"
            with httpx.Client(base_url=base, headers=headers, timeout=120) as client:
                print(f"\nplatform ({args.attempts:,} attempts in one run)")
                for line in report(client, platform_pages, args.repeat):
                    print(line)
            view = f"http://127.0.0.1:{view_port}"
            wait_until_up(view + "/", {})
            view_pages = {
                "runs page (/)": "/",
                **sample_pages("big"),
                "compare 3 runs (matrix, changed rows)": "/compare?run=big&run=b2&run=b3",
                "compare 3 runs, one row side by side": "/compare/rows/7?run=big&run=b2&run=b3",
            }
            with httpx.Client(base_url=view, headers={"Accept": "text/html"}, timeout=120) as c:
                print(f"\neval view (3 local runs of {args.attempts:,} attempts)")
                for line in report(c, view_pages, args.repeat):
                    print(line)
        finally:
            viewer.terminate()
            viewer.wait(timeout=30)
            subprocess.run([*CLI, "server", "stop"], env=env, capture_output=True)


if __name__ == "__main__":
    main()
