"""Requests/s, p50 and p99 of the platform's list, info and health routes under concurrent clients.

    .venv/bin/python bench/load.py [--clients 10,50] [--seconds 10] [--database-url URL | --both]

Starts a real server (`osmosis server start --detach`) on a free loopback port with a seeded
home: a pushed git workspace, a few datasets and a few runs that finished on the scripted model.
Then, for each client count, that many clients (one connection each) request the list and info
routes of datasets and runs and `/api/health` in turn, back to back, for `--seconds`. One table
shows requests/s, p50, p99, 5xx and transport errors per route and client count. Loopback only;
bounded in time. `--database-url` runs the same bench on another database (PostgreSQL: an
empty database the server migrates and seeds). `--both` runs it on SQLite, then on a
throwaway PostgreSQL cluster (the test suite's, tests/platform/databases.py: `initdb` on a
free loopback port, with PostgreSQL's default durability), and ends with both side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import httpx

from osmosis.client import PlatformClient
from osmosis.testing import FakeModelServer
from osmosis.vocabulary import TERMINAL_RUN_STATUSES
from osmosis.workspace import normalise_identity


def _platform_bench() -> ModuleType:
    """bench/platform.py, for its workspace and CLI helpers (loaded under another name: as a
    plain import it would shadow the standard library's `platform`)."""
    spec = importlib.util.spec_from_file_location(
        "osmosis_bench_platform", Path(__file__).with_name("platform.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


helpers = _platform_bench()


def _test_databases() -> ModuleType:
    """tests/platform/databases.py: the throwaway PostgreSQL cluster of the test suite."""
    path = Path(__file__).resolve().parents[1] / "tests" / "platform" / "databases.py"
    spec = importlib.util.spec_from_file_location("osmosis_test_databases", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@dataclass
class Seeded:
    url: str
    token: str
    git: str
    datasets: list[str]
    runs: list[str]


def seed(tree: Path, env: dict[str, str], *, datasets: int, runs: int) -> Seeded:
    """Upload `datasets` datasets and finish `runs` runs of the workspace at `tree`."""
    names = ["bench"]
    for index in range(2, datasets + 1):
        shutil.copyfile(tree / "data" / "bench.jsonl", tree / "data" / f"bench_{index}.jsonl")
        names.append(f"bench_{index}")
    for name in names:
        helpers.osmosis("dataset", "upload", f"data/{name}.jsonl", "-y", cwd=tree, env=env)
    credentials = json.loads((Path(env["OSMOSIS_HOME"]) / "credentials.json").read_text())
    run_ids = []
    with PlatformClient(credentials["platform_url"], credentials["token"]) as client:
        for _ in range(runs):
            out = helpers.osmosis(
                "--json", "eval", "submit", "configs/eval/bench.toml", "-y", cwd=tree, env=env
            )
            name = json.loads(out)["resource"]["name"]
            while (detail := client.runs.get(name)).eval_run.status not in TERMINAL_RUN_STATUSES:
                time.sleep(0.5)
            run_ids.append(detail.eval_run.id)
    origin = tree.parent / "origin.git"
    return Seeded(
        url=credentials["platform_url"],
        token=credentials["token"],
        git=normalise_identity(str(origin)),
        datasets=names,
        runs=run_ids,
    )


# -- the load ----------------------------------------------------------------------------------
@dataclass
class RouteFigures:
    latencies: list[float] = field(default_factory=list)
    server_errors: int = 0
    transport_errors: int = 0


def routes(world: Seeded) -> dict[str, list[str]]:
    """Route label → the concrete paths it cycles through."""
    return {
        "datasets list": ["/api/datasets"],
        "dataset info": [f"/api/datasets/{name}" for name in world.datasets],
        "runs list": ["/api/eval-runs"],
        "run info": [f"/api/eval-runs/{run}" for run in world.runs],
        "health": ["/api/health"],
    }


async def client_loop(
    world: Seeded, index: int, until: float, figures: dict[str, RouteFigures]
) -> None:
    table = routes(world)
    labels = list(table)
    headers = {"Authorization": f"Bearer {world.token}", "X-Osmosis-Git": world.git}
    limits = httpx.Limits(max_connections=1)
    step = index  # clients start at different routes, so every route is hit at every moment
    async with httpx.AsyncClient(
        base_url=world.url, headers=headers, limits=limits, timeout=60, trust_env=False
    ) as client:
        while time.monotonic() < until:
            label = labels[step % len(labels)]
            paths = table[label]
            path = paths[(step // len(labels)) % len(paths)]
            step += 1
            started = time.perf_counter()
            try:
                response = await client.get(path)
            except httpx.HTTPError:
                figures[label].transport_errors += 1
                continue
            figures[label].latencies.append(time.perf_counter() - started)
            if response.status_code >= 500:
                figures[label].server_errors += 1


@dataclass
class Level:
    clients: int
    elapsed: float  # until the last request sent before the deadline was answered
    figures: dict[str, RouteFigures]


async def drive(world: Seeded, clients: int, seconds: float) -> Level:
    figures = {label: RouteFigures() for label in routes(world)}
    started = time.monotonic()
    until = started + seconds
    await asyncio.gather(*(client_loop(world, i, until, figures) for i in range(clients)))
    return Level(clients=clients, elapsed=time.monotonic() - started, figures=figures)


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def print_table(levels: list[Level]) -> None:
    header = (
        f"{'clients':>7}  {'route':<14}{'requests':>9}{'req/s':>9}{'p50 ms':>9}"
        f"{'p99 ms':>9}{'5xx':>6}{'errors':>8}"
    )
    print(header)
    print("-" * len(header))
    for level in levels:
        everything = RouteFigures()
        for part in level.figures.values():
            everything.latencies += part.latencies
            everything.server_errors += part.server_errors
            everything.transport_errors += part.transport_errors
        for label, part in [*level.figures.items(), ("all routes", everything)]:
            done = len(part.latencies)
            print(
                f"{level.clients:>7}  {label:<14}{done:>9}{done / level.elapsed:>9.1f}"
                f"{quantile(part.latencies, 0.50) * 1000:>9.1f}"
                f"{quantile(part.latencies, 0.99) * 1000:>9.1f}"
                f"{part.server_errors:>6}{part.transport_errors:>8}"
            )
        print()


@dataclass
class Outcome:
    database: str
    world: Seeded
    levels: list[Level]


def bench(args: argparse.Namespace, counts: list[int], database_url: str | None) -> Outcome:
    """Seed a fresh server on `database_url` (None: SQLite in its home) and load it."""
    with FakeModelServer() as model, tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        tree = helpers.make_workspace(root, 8, 8)
        env = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS_")}
        env.update(
            OPENAI_API_BASE=model.base_url,
            OPENAI_API_KEY="sk-bench",
            OSMOSIS_HOME=str(root / "home"),
            OSMOSIS_CONFIG_DIR=str(root / "config"),
        )
        if database_url:
            env["OSMOSIS_DATABASE_URL"] = database_url
        if args.max_requests:
            env["OSMOSIS_MAX_REQUESTS"] = str(args.max_requests)
        port = helpers.free_port()
        helpers.osmosis("server", "start", "--detach", "--port", str(port), cwd=root, env=env)
        try:
            world = seed(tree, env, datasets=args.datasets, runs=args.runs)
            levels = [asyncio.run(drive(world, n, args.seconds)) for n in counts]
        finally:
            helpers.osmosis("server", "stop", cwd=root, env=env)
    database = "PostgreSQL" if "postgres" in (database_url or "") else "SQLite"
    return Outcome(database=database, world=world, levels=levels)


def print_outcome(outcome: Outcome, seconds: float) -> None:
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    print(
        f"{outcome.database}; {len(outcome.world.datasets)} datasets, "
        f"{len(outcome.world.runs)} runs; {seconds:.0f} s per client count; "
        f"{os.cpu_count()} cores, load average {load}"
    )
    print_table(outcome.levels)


def print_side_by_side(outcomes: list[Outcome]) -> None:
    """p99 (ms) of each route at each client count, one column per database."""
    header = f"{'clients':>7}  {'route':<14}" + "".join(f"{o.database:>12}" for o in outcomes)
    print("p99 ms, side by side")
    print(header)
    print("-" * len(header))
    for index, level in enumerate(outcomes[0].levels):
        for label in level.figures:
            cells = "".join(
                f"{quantile(o.levels[index].figures[label].latencies, 0.99) * 1000:>12.1f}"
                for o in outcomes
            )
            print(f"{level.clients:>7}  {label:<14}{cells}")
        print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="10,50", help="Comma-separated client counts.")
    parser.add_argument("--seconds", type=float, default=10.0, help="Load time per count.")
    parser.add_argument("--datasets", type=int, default=3)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument(
        "--database-url", default=None, help="Database of the server (default: SQLite in home)."
    )
    parser.add_argument(
        "--both",
        action="store_true",
        help="SQLite, then a throwaway PostgreSQL cluster; ends with p99 side by side.",
    )
    parser.add_argument(
        "--max-requests", type=int, default=None, help="OSMOSIS_MAX_REQUESTS of the server."
    )
    args = parser.parse_args()
    counts = [int(part) for part in args.clients.split(",") if part.strip()]
    if args.both and args.database_url:
        parser.error("--both brings its own PostgreSQL; leave out --database-url")
    if not args.both:
        print_outcome(bench(args, counts, args.database_url), args.seconds)
        return
    databases = _test_databases()  # before the first half: a missing PostgreSQL fails fast
    outcomes = [bench(args, counts, None)]
    print_outcome(outcomes[0], args.seconds)
    cluster = databases.PostgresCluster.throwaway(durable=True)
    try:
        url = cluster.create_database(migrated=False)  # the server migrates it, as in production
        outcomes.append(bench(args, counts, url))
    finally:
        cluster.stop()
    print_outcome(outcomes[1], args.seconds)
    print_side_by_side(outcomes)


if __name__ == "__main__":
    main()
