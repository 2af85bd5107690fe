"""The Ray executor's figures (issues 15 and 30), on a two-node Ray cluster on loopback.

    .venv/bin/python bench/ray.py [--cases latency,overhead,transport] [--attempts N]
                                  [--repeat R]

It starts the same test cluster as tests/integration/test_ray_cluster.py (`ray start` twice,
closed to the network, without strace) and runs `osmosis eval run` against the scripted
model, each replica's capacity fixed at 16 (`max_concurrent`):

  latency    500 ms model latency, 400 attempts, `--executor ray` with 1 and with 2 replicas
             (one per node): attempts/s over the dispatch (first attempt's start to the last
             one's end, from the journal), against the ideal (replicas x 16 / 0.5 s), and the
             2-replica speed-up (target >= 1.7x). The local executor's figures beside them.
  overhead   0 ms latency, 1 replica, 1,000 attempts (16 in flight): the Ray path's cost per
             attempt over the local engine's: wall ms per attempt over the dispatch, and CPU ms
             per attempt of every process involved (engine, rollout server, and for Ray the
             replica's actor, the raylets and the GCS), measured between the 10th and the 90th
             percentile of recorded attempts (start-up left out); the wall ratio against local
             (issue 30's target: <= 1.5x). The site's default: protocol calls straight to the
             server, which answers from here (the run's log says so, and the row).
  transport  the same 0 ms run with the protocol calls relayed by the replica's actor
             (`transport="actor"`: the site's only path before issue 30, and its fallback
             when the server does not answer from the engine's machine): the relay's price.

Each row says the load average around it: 2 shared cores, so `--repeat R` runs every
configuration R times, interleaved, after one untimed run of each Ray configuration, and
prints the medians (and each run's figures, with the CPU of each process: Ray workers
booting during a run show as `python` and `ray::IDLE`).
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, bench/ comes first on sys.path (bench/platform.py would shadow `platform`).
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/ for the cluster
# ruff: noqa: E402

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime

import bench.engine as engine_bench
from tests.integration.test_ray_cluster import RayCluster

from osmosis.testing import FakeModelServer

CAPACITY = 16  # each replica's max_concurrent
# `eval run`, with the Ray site relaying every protocol call through the replica's actor.
RELAY_TRANSPORT = (
    "from osmosis.eval.sites.ray.site import RaySite\n"
    "RaySite.__init__.__kwdefaults__['transport'] = 'actor'\n"
    "from osmosis.cli.main import run; run()\n"
)
CLI = "from osmosis.cli.main import run; run()"
_TICK = os.sysconf("SC_CLK_TCK")


def make_workspace(root: Path, rows: int) -> Path:
    """bench/engine.py's one-call rollout and dataset, each server's capacity set to 16."""
    config = engine_bench.make_workspace(root, rows)
    main = root / "rollouts" / "bench" / "main.py"
    main.write_text(main.read_text().replace("max_concurrent=1024", f"max_concurrent={CAPACITY}"))
    return config


def processes() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds so far) of every process."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[int(stat.parent.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK)
    return found


def below(roots: set[int], table: dict[int, tuple[int, float]]) -> set[int]:
    inside, grew = set(roots), True
    while grew:
        more = {pid for pid, (parent, _) in table.items() if parent in inside} - inside
        inside |= more
        grew = bool(more)
    return inside


@dataclass
class Watch:
    """CPU of the engine and of the cluster, sampled with the journal's count."""

    roots: set[int]
    journal: Path
    engine: int = 0
    samples: list[tuple[float, int, float]] = field(default_factory=list)
    last: dict[int, float] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    kinds: dict[int, str] = field(default_factory=dict)
    by_kind: list[dict[str, float]] = field(default_factory=list)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                recorded = self.journal.read_bytes().count(b"\n")
            except OSError:
                recorded = 0
            table = processes()
            for pid in below(self.roots, table) & table.keys():
                self.last[pid] = table[pid][1]  # an exited process keeps its last reading
                if pid not in self.kinds:
                    self.kinds[pid] = self.kind(pid)
            self.samples.append((time.monotonic(), recorded, sum(self.last.values())))
            kinds: dict[str, float] = {}
            for pid, cpu in self.last.items():
                kinds[self.kinds[pid]] = kinds.get(self.kinds[pid], 0.0) + cpu
            self.by_kind.append(kinds)
            time.sleep(0.05)

    def kind(self, pid: int) -> str:
        """Which part of the run a process is: the engine, the rollout server, or Ray's
        process name (`ray::RolloutReplica` is the replica's actor)."""
        if pid == self.engine:
            return "engine"
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            return "other"
        if b"rollouts/bench/main.py" in cmdline:
            return "rollout server"
        return comm

    def window(self, attempts: int) -> tuple[int, int]:
        low = next(i for i, s in enumerate(self.samples) if s[1] >= attempts * 0.1)
        high = next(
            (i for i, s in enumerate(self.samples) if s[1] >= attempts * 0.9),
            len(self.samples) - 1,
        )
        if self.samples[high][1] - self.samples[low][1] <= 0:
            raise SystemExit("too short to measure: give it more attempts")
        return low, high

    def cpu_ms_per_attempt(self, attempts: int) -> float:
        low, high = self.window(attempts)
        done = self.samples[high][1] - self.samples[low][1]
        return (self.samples[high][2] - self.samples[low][2]) * 1000 / done

    def cpu_ms_by_kind(self, attempts: int) -> dict[str, float]:
        low, high = self.window(attempts)
        done = self.samples[high][1] - self.samples[low][1]
        start, end = self.by_kind[low], self.by_kind[high]
        spent = {k: (end[k] - start.get(k, 0.0)) * 1000 / done for k in end}
        return dict(sorted(((k, v) for k, v in spent.items() if v >= 0.05), key=lambda kv: -kv[1]))


@dataclass
class Run:
    attempts: int
    dispatch_s: float
    cpu_ms: float
    load: tuple[float, float]
    nodes: int
    path: str = ""
    """For Ray: how the run's log says the engine reached its server (direct or relay)."""
    cpu_by_kind: dict[str, float] = field(default_factory=dict)
    """CPU ms per attempt by process (`Watch.kind`)."""

    @property
    def rate(self) -> float:
        return self.attempts / self.dispatch_s


def eval_run(
    model: FakeModelServer,
    attempts: int,
    *,
    cluster: RayCluster | None,
    replicas: int,
    entry: str = CLI,
) -> Run:
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as workdir:
        config = make_workspace(Path(workdir), attempts)
        env = {**(cluster.env if cluster else os.environ)}
        env.update(OPENAI_API_BASE=model.base_url, OPENAI_API_KEY="sk-bench")
        flags = ["--replicas", str(replicas)]
        if cluster is not None:
            flags += ["--executor", "ray", "--ray-address", cluster.address]
        command = [sys.executable, "-c", entry, "eval", "run", str(config), "--name", "b"]
        process = subprocess.Popen(
            [*command, "-y", "--json", *flags],
            cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        journal = Path(workdir) / ".osmosis" / "evals" / "b" / "events.jsonl"
        roots = {process.pid} | ({n.process.pid for n in cluster.nodes} if cluster else set())
        watch = Watch(roots, journal, engine=process.pid)
        watcher = threading.Thread(target=watch.run)
        watcher.start()
        _, err = process.communicate()
        watch.stop.set()
        watcher.join()
        if process.returncode != 0:
            raise SystemExit(f"eval run failed ({process.returncode}):\n{err[-3000:]}")
        records = [json.loads(line) for line in journal.read_text().splitlines()]
        log = (journal.parent / "logs.txt").read_text()
        path = (
            "direct" if "protocol calls straight to" in log
            else "relay" if "protocol calls relayed" in log
            else ""
        )  # fmt: skip
    if len(records) != attempts:
        raise SystemExit(f"expected {attempts} recorded attempts, found {len(records)}")
    ends = [datetime.fromisoformat(r["finished_at"]).timestamp() for r in records]
    starts = [end - r["duration_ms"] / 1000 for end, r in zip(ends, records, strict=True)]
    return Run(
        attempts=attempts,
        dispatch_s=max(ends) - min(starts),
        cpu_ms=watch.cpu_ms_per_attempt(attempts),
        cpu_by_kind=watch.cpu_ms_by_kind(attempts),
        load=(load, os.getloadavg()[0]),
        nodes=len({r.get("node") for r in records}),
        path=path,
    )


def row(case: str, figure: str, reference: str, run: Run | None = None) -> None:
    load = f"load {run.load[0]:.1f}-{run.load[1]:.1f}" if run else ""
    print(f"{case:<44} {figure:<34} {reference:<40} {load}", flush=True)


def case_latency(cluster: RayCluster, attempts: int) -> None:
    with FakeModelServer(latency=0.5) as model:
        runs = {
            (where, replicas): eval_run(
                model, attempts, cluster=cluster if where == "ray" else None, replicas=replicas
            )
            for where in ("ray", "local")
            for replicas in (1, 2)
        }
    for (where, replicas), run in runs.items():
        ideal = replicas * CAPACITY / 0.5
        row(
            f"500 ms, {attempts}, capacity 16: {where} x{replicas}",
            f"{run.rate:.1f} attempts/s on {run.nodes} node(s)",
            f"ideal {ideal:.0f}/s: {run.rate / ideal:.0%} of it",
            run,
        )
    for where in ("ray", "local"):
        speedup = runs[(where, 2)].rate / runs[(where, 1)].rate
        row(f"  {where}: 2 replicas / 1", f"{speedup:.2f}x", "target >= 1.70x")


def median_run(runs: list[Run]) -> Run:
    """The figures' medians (each figure on its own), the load range of all the runs."""
    return Run(
        attempts=runs[0].attempts,
        dispatch_s=statistics.median(r.dispatch_s for r in runs),
        cpu_ms=statistics.median(r.cpu_ms for r in runs),
        load=(min(r.load[0] for r in runs), max(r.load[1] for r in runs)),
        nodes=runs[0].nodes,
        path="/".join(sorted({r.path for r in runs if r.path})),
    )


def idle_cpu_ms_per_s(cluster: RayCluster, seconds: float = 5.0) -> float:
    """CPU ms per second the cluster's own processes burn with no run: part of every Ray
    row's CPU per attempt (this rate times its wall ms per attempt), whatever the transport."""
    roots = {node.process.pid for node in cluster.nodes}

    def total() -> float:
        table = processes()
        return sum(table[pid][1] for pid in below(roots, table) if pid in table)

    before, started = total(), time.monotonic()
    time.sleep(seconds)
    return (total() - before) * 1000 / (time.monotonic() - started)


def case_overhead(cluster: RayCluster, attempts: int, *, transport: bool, repeat: int) -> None:
    idle = idle_cpu_ms_per_s(cluster)
    row(
        "  the idle cluster (2 nodes)",
        f"{idle:.0f} CPU ms/s",
        f"{idle / 1000:.2f} CPU ms per wall ms of a Ray run",
    )
    labels = ["local engine", "ray (default)"] + (["ray (actor relay)"] if transport else [])
    runs: dict[str, list[Run]] = {label: [] for label in labels}
    with FakeModelServer() as model:
        # Untimed: a fresh cluster's first job boots and prestarts its Ray workers (their
        # CPU landed in round 1's dispatch, and the ratio's spread started there).
        for label in labels[1:]:
            eval_run(model, min(attempts, 300), cluster=cluster, replicas=1,
                     entry=RELAY_TRANSPORT if label == "ray (actor relay)" else CLI)  # fmt: skip
        for _ in range(repeat):  # interleaved: a load spike touches every configuration
            for label in labels:
                run = eval_run(
                    model,
                    attempts,
                    cluster=None if label == "local engine" else cluster,
                    replicas=1,
                    entry=RELAY_TRANSPORT if label == "ray (actor relay)" else CLI,
                )
                runs[label].append(run)
                if repeat > 1:
                    row(
                        f"  run: {label}",
                        f"{run.dispatch_s * 1000 / attempts:.2f} ms wall {run.path}",
                        f"{run.cpu_ms:.2f} CPU ms",
                        run,
                    )
                shares = ", ".join(f"{k} {v:.2f}" for k, v in run.cpu_by_kind.items())
                print(f"      CPU ms/attempt by process: {shares}", flush=True)
    medians = {label: median_run(found) for label, found in runs.items()}
    local = medians["local engine"]
    median = f" (median of {repeat})" if repeat > 1 else ""
    for label, run in medians.items():
        path = f", {run.path}" if run.path else ""
        row(
            f"0 ms, {attempts}, 1 replica: {label}{path}",
            f"{run.dispatch_s * 1000 / attempts:.2f} ms/attempt wall{median}",
            f"{run.cpu_ms:.2f} CPU ms/attempt (all processes)",
            run,
        )
    for label, run in medians.items():
        if run is local:
            continue
        wall = (run.dispatch_s - local.dispatch_s) * 1000 / attempts
        row(
            f"  {label} over local",
            f"{run.dispatch_s / local.dispatch_s:.2f}x wall (+{wall:.2f} ms/attempt)",
            f"{run.cpu_ms / local.cpu_ms:.2f}x CPU (+{run.cpu_ms - local.cpu_ms:.2f} ms); "
            "target wall <= 1.50x",
        )
        if repeat > 1:  # each round's ratio: the load that round, on both sides of it
            rounds = [
                r.dispatch_s / base.dispatch_s
                for r, base in zip(runs[label], runs["local engine"], strict=True)
            ]
            row(
                f"  {label} over local, round by round",
                f"median {statistics.median(rounds):.2f}x wall",
                " ".join(f"{ratio:.2f}x" for ratio in rounds),
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="latency,overhead,transport")
    parser.add_argument("--attempts", type=int, default=400, help="latency case attempts")
    parser.add_argument("--overhead-attempts", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=1, help="runs per overhead configuration")
    args = parser.parse_args()
    cases = set(args.cases.split(","))
    with tempfile.TemporaryDirectory(prefix="osmosis-ray-bench-") as root:
        started = time.monotonic()
        cluster = RayCluster.start(Path(root), trace=False)
        print(f"cluster: 2 nodes on 127.0.0.1 in {time.monotonic() - started:.1f} s")
        try:
            if "latency" in cases:
                case_latency(cluster, args.attempts)
            if cases & {"overhead", "transport"}:
                case_overhead(
                    cluster,
                    args.overhead_attempts,
                    transport="transport" in cases,
                    repeat=args.repeat,
                )
        finally:
            cluster.stop()
            left = cluster.leftovers()
            if left:
                print(f"Ray processes left behind: {left}", file=sys.stderr)


if __name__ == "__main__":
    main()
