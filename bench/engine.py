"""Throughput, latency overhead and memory of `osmosis eval run` against the scripted model.

    .venv/bin/python bench/engine.py [--cases a,b,c,d,replicas] [--repeat N] [--scratch DIR]
                                     [--sample]

Every figure is set beside a limit measured in the same run, on the same machine, and the
table says the machine's load average beside each case (2 shared cores: a figure taken under
a high load says more about the neighbours than about osmosis; repeat it).

Cases (issue 18, and issue 11's replica rows):
  (a)  0 ms model latency, concurrency 64, 2,000 attempts: attempts/s and CPU ms per attempt
       of the engine process (with its model bridge) and of the rollout server, against a
       bare aiohttp client making the same 2,000 model calls (its own process, its own CPU).
  (b)  200 ms latency, concurrency 64, 500 attempts: dispatch time (first attempt's start to
       last attempt's end, from the journal) / ideal (attempts / concurrency x latency); the
       bare client's ratio beside it. Below it, an attempt's mean duration over the model's
       latency against a bare call's: a mean of 500, steadier under load than the span. Then
       the span told apart along the slot that ended last (issue 30): its first attempt and
       the others apart (the first waits for its admission behind the whole first wave: an
       attempt's clock starts when it is dispatched, before its admission is sent), the gaps
       between them (a freed slot's hand-off to the next dispatch) and its start's skew.
  (c)  1 s latency, concurrency 512, 5,000 attempts: dispatch / ideal, and peak RSS of the
       engine and of the rollout server.
  (d)  rollout server peak RSS after 500 and after 10,000 attempts (0 ms, concurrency 64).
  replicas  0 ms, concurrency 64, 2,000 attempts over 1 and 2 rollout servers (issue 11),
       then the same 2,000 attempts drawn from a 100,000-row dataset: the engine's peak RSS
       must not follow the dataset's size; with --sample also the default 10 % sample of
       100,000 rows (10,000 attempts).

The first row says how late a 200 ms timer fires on this machine and what a folder and a file
cost to create where the runs write: both move (b), the bare client's figure too, from one
machine or day to the next (a slow temporary directory: try `--scratch`).

CPU per attempt is the marginal cost: CPU seconds spent between the 10th and the 90th
percentile of recorded attempts (read from /proc), divided by the attempts recorded in
between, so start-up (imports, environment, servers) is left out. `--scratch /dev/shm` puts
the workspace and run directory on tmpfs, which tells file-system cost from our own.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, bench/ comes first on sys.path, and bench/platform.py would shadow the
# standard library's `platform` (which aiohttp, httpx and uuid import).
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]
# ruff: noqa: E402

import argparse
import asyncio
import heapq
import json
import os
import statistics
import subprocess
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from osmosis.eval.sites.cpu_split import switched_off
from osmosis.testing import FakeModelServer

ROLLOUT = """
import os
import uvicorn
from osmosis import (AgentWorkflow, AgentWorkflowConfig, ConcurrencyConfig, Grader,
                     LocalBackend, create_rollout_server)

class OneCall(AgentWorkflow):
    async def run(self, ctx):
        return [*ctx.prompt, await ctx.chat(ctx.prompt)]

class Exact(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0 if ctx.label in ctx.sample.messages[-1]["content"] else 0.0)

app = create_rollout_server(
    backend=LocalBackend(workflow=OneCall, grader=Exact, workflow_config=AgentWorkflowConfig(
        name="bench", concurrency=ConcurrencyConfig(max_concurrent=1024))),
    configure_logging=False,
)
if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]),
                log_level="warning", access_log=False)
"""

# The limit: the same chat completion straight to the model server, one process, aiohttp.
BARE_CLIENT = """
import asyncio, json, sys, time
import aiohttp

async def main(url, calls, concurrency):
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as client:
        todo = iter(range(calls))
        spans = []

        async def worker():
            for index in todo:
                body = {"model": "fake-model",
                        "messages": [{"role": "user", "content": f"What is {index % 97} * 3?"}]}
                began = time.monotonic()
                async with client.post(url + "/chat/completions", json=body) as reply:
                    reply.raise_for_status()
                    await reply.read()
                spans.append((began, time.monotonic()))

        cpu, wall = time.process_time(), time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    dispatch = max(end for _, end in spans) - min(start for start, _ in spans)
    mean_ms = sum(end - start for start, end in spans) * 1000 / len(spans)
    print(json.dumps({"rate": calls / wall, "cpu_ms": cpu * 1000 / calls, "dispatch_s": dispatch,
                      "mean_ms": mean_ms, "spans": spans}))

asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
"""

_TICK = os.sysconf("SC_CLK_TCK")


def make_workspace(root: Path, rows: int, limit: int | None = None) -> Path:
    (root / "rollouts" / "bench").mkdir(parents=True)
    (root / "configs" / "eval").mkdir(parents=True)
    (root / "data").mkdir()
    (root / "rollouts" / "bench" / "main.py").write_text(textwrap.dedent(ROLLOUT))
    with (root / "data" / "bench.jsonl").open("w") as handle:
        for index in range(rows):
            a, b = index % 97 + 2, index % 89 + 3
            handle.write(
                json.dumps({"user_prompt": f"What is {a} * {b}?", "ground_truth": str(a * b)})
                + "\n"
            )
    config = root / "configs" / "eval" / "bench.toml"
    config.write_text(
        '[experiment]\nrollout = "bench"\nentrypoint = "main.py"\n'
        'model_path = "openai/fake-model"\ndataset = "bench"\n\n'
        f"[evaluation]\n{f'limit = {limit}' if limit else ''}\n"
        "agent_workflow_timeout_s = 120\ngrader_timeout_s = 30\n\n"
        "[secrets]\nrequired = []\n"
    )
    return config


def cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


def peak_rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def rollout_servers(engine_pid: int) -> list[int]:
    """The engine's rollout server processes (its children running the bench's main.py)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if parent == engine_pid and b"main.py" in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


@dataclass
class Sample:
    at: float
    recorded: int
    engine_cpu: float
    rollout_cpu: float


@dataclass
class Watch:
    """Polls the engine, its rollout servers and the journal while `eval run` works."""

    engine_pid: int
    journal: Path
    samples: list[Sample] = field(default_factory=list)
    peaks: dict[int, float] = field(default_factory=dict)
    last_cpu: dict[int, float] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        recorded, offset = 0, 0
        servers: list[int] = []
        while not self.stop.is_set():
            if len(servers) < 1 or len(self.samples) % 25 == 0:
                servers = sorted(set(servers) | set(rollout_servers(self.engine_pid)))
            try:
                with self.journal.open("rb") as handle:
                    handle.seek(offset)
                    chunk = handle.read()
                recorded += chunk.count(b"\n")
                offset += len(chunk)
            except OSError:
                pass
            engine = cpu_seconds(self.engine_pid)
            for pid in servers:
                cpu = cpu_seconds(pid)
                if cpu is not None:  # a replaced or exited server keeps its last reading
                    self.last_cpu[pid] = cpu
                    self.peaks[pid] = max(self.peaks.get(pid, 0.0), peak_rss_mib(pid))
            self.peaks[self.engine_pid] = max(
                self.peaks.get(self.engine_pid, 0.0), peak_rss_mib(self.engine_pid)
            )
            if engine is not None:
                self.samples.append(
                    Sample(time.monotonic(), recorded, engine, sum(self.last_cpu.values()))
                )
            time.sleep(0.02)

    def marginal(self, attempts: int) -> tuple[float, float, float]:
        """(attempts/s, engine CPU ms per attempt, rollout servers' CPU ms per attempt)
        between the 10th and 90th percentile of recorded attempts."""
        low = next(s for s in self.samples if s.recorded >= attempts * 0.1)
        # The last reading before the engine exited, if it wrote its last tenth in between.
        high = next((s for s in self.samples if s.recorded >= attempts * 0.9), self.samples[-1])
        done = high.recorded - low.recorded
        if done <= 0:
            raise SystemExit("the run was too short to measure; give it more attempts")
        return (
            done / (high.at - low.at),
            (high.engine_cpu - low.engine_cpu) * 1000 / done,
            (high.rollout_cpu - low.rollout_cpu) * 1000 / done,
        )


@dataclass
class EngineRun:
    attempts: int
    attempts_per_s: float
    engine_cpu_ms: float
    rollout_cpu_ms: float
    dispatch_s: float
    mean_ms: float  # an attempt's mean duration, dispatch to result (the journal's duration_ms)
    last_slot: LastSlot
    engine_peak_mib: float
    rollout_peak_mib: float
    load: tuple[float, float]


def run_engine(
    model: FakeModelServer,
    attempts: int,
    concurrency: int,
    scratch: str | None,
    *,
    replicas: int = 1,
    rows: int | None = None,
    env: dict[str, str] | None = None,
) -> EngineRun:
    """One `eval run` of `attempts` attempts (the first of `rows` rows, by default as many);
    `env`: variables set for it on top of this process's (bench/ab.py's PYTHONPATH)."""
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(dir=scratch) as workdir:
        limit = attempts if rows is not None and rows > attempts else None
        config = make_workspace(Path(workdir), rows or attempts, limit)
        variables = {
            **os.environ,
            **(env or {}),
            "OPENAI_API_BASE": model.base_url,
            "OPENAI_API_KEY": "sk-bench",
        }
        command = [
            sys.executable,
            "-c",
            "from osmosis.cli.main import run; run()",
            *("eval", "run", str(config), "--name", "bench", "-y", "--json"),
            *("--max-in-flight", str(concurrency), "--replicas", str(replicas)),
        ]
        process = subprocess.Popen(
            command,
            cwd=workdir,
            env=variables,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        journal = Path(workdir) / ".osmosis" / "evals" / "bench" / "events.jsonl"
        watch = Watch(process.pid, journal)
        watcher = threading.Thread(target=watch.run)
        watcher.start()
        _, err = process.communicate()
        watch.stop.set()
        watcher.join()
        if process.returncode != 0:
            raise SystemExit(f"eval run failed ({process.returncode}):\n{err[-3000:]}")
        records = [json.loads(line) for line in journal.read_text().splitlines()]
    if len(records) != attempts:
        raise SystemExit(f"expected {attempts} recorded attempts, found {len(records)}")
    ends = [datetime.fromisoformat(r["finished_at"]).timestamp() for r in records]
    starts = [end - r["duration_ms"] / 1000 for end, r in zip(ends, records, strict=True)]
    rate, engine_ms, rollout_ms = watch.marginal(attempts)
    servers = [pid for pid in watch.peaks if pid != process.pid]
    return EngineRun(
        attempts=attempts,
        attempts_per_s=rate,
        engine_cpu_ms=engine_ms,
        rollout_cpu_ms=rollout_ms,
        dispatch_s=max(ends) - min(starts),
        mean_ms=sum(r["duration_ms"] for r in records) / len(records),
        last_slot=last_slot(list(zip(starts, ends, strict=True)), concurrency),
        engine_peak_mib=watch.peaks.get(process.pid, 0.0),
        rollout_peak_mib=max((watch.peaks[pid] for pid in servers), default=0.0),
        load=(load_before, os.getloadavg()[0]),
    )


@dataclass
class BareRun:
    attempts_per_s: float
    cpu_ms: float
    dispatch_s: float
    mean_ms: float  # a call's mean duration
    last_slot: LastSlot
    load: tuple[float, float]


@dataclass
class LastSlot:
    """The span from the first start to the last end, told apart along the concurrency slot
    that ended last (issue 30): its first attempt's start after the run's first (`skew`), the
    first attempt's duration and the others', and the gaps between one's end and the next
    one's start (the hand-off of a freed slot to the next dispatch)."""

    attempts: int
    skew_ms: float
    first_ms: float  # the first attempt's duration: it includes the first wave's admissions
    durations_ms: float  # every attempt's, the first's included
    gaps_ms: float

    def __str__(self) -> str:
        others = (self.durations_ms - self.first_ms) / max(self.attempts - 1, 1)
        return (
            f"{self.first_ms:.1f} + {self.attempts - 1} x {others:.1f} ms"
            f" + gaps {self.gaps_ms:.1f} ms + skew {self.skew_ms:.1f} ms"
        )


def last_slot(spans: list[tuple[float, float]], concurrency: int) -> LastSlot:
    """Slots rebuilt from (start, end) stamps: each start past the first `concurrency` takes
    the slot that freed earliest (what the engine's dispatch does)."""
    ordered = sorted(spans)
    first = ordered[0][0]
    free = [(end, slot) for slot, (_, end) in enumerate(ordered[:concurrency])]
    heapq.heapify(free)
    chains = {slot: [span] for slot, span in enumerate(ordered[:concurrency])}
    for start, end in ordered[concurrency:]:
        _, slot = heapq.heappop(free)
        chains[slot].append((start, end))
        heapq.heappush(free, (end, slot))
    chain = max(chains.values(), key=lambda chain: chain[-1][1])
    return LastSlot(
        attempts=len(chain),
        skew_ms=(chain[0][0] - first) * 1000,
        first_ms=(chain[0][1] - chain[0][0]) * 1000,
        durations_ms=sum(end - start for start, end in chain) * 1000,
        gaps_ms=sum(chain[i][0] - chain[i - 1][1] for i in range(1, len(chain))) * 1000,
    )


def run_bare(model: FakeModelServer, calls: int, concurrency: int) -> BareRun:
    load_before = os.getloadavg()[0]
    out = subprocess.run(
        [sys.executable, "-c", BARE_CLIENT, model.base_url, str(calls), str(concurrency)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    figures = json.loads(out)
    return BareRun(
        figures["rate"],
        figures["cpu_ms"],
        figures["dispatch_s"],
        figures["mean_ms"],
        last_slot([(start, end) for start, end in figures["spans"]], concurrency),
        (load_before, os.getloadavg()[0]),
    )


class Table:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str, str]] = []

    def add(
        self, case: str, figure: str, limit: str, ratio: str, load: tuple[float, float]
    ) -> None:
        self.rows.append((case, figure, limit, ratio, f"{load[0]:.1f}-{load[1]:.1f}"))

    def print(self) -> None:
        head = ("case", "osmosis", "limit (same run)", "ratio (target)", "load")
        widths = [max(len(row[i]) for row in [head, *self.rows]) for i in range(5)]
        for row in [head, *self.rows]:
            print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))


def machine_row(table: Table, scratch: str | None) -> None:
    """How late this machine's timers fire and what a file costs to create where the runs
    write: two things that move (b) from one machine, or one day, to the next, for the bare
    client too (a scripted model's 200 ms answer is a timer; every attempt writes files).
    Beside them, the CPUs the runs may use and whether their event loop and rollout server
    get CPUs of their own (`eval/sites/cpu_split.py`), which moves (b) by ~2.5 points."""
    load = os.getloadavg()[0]

    async def overshoot() -> float:
        late = []
        for _ in range(5):
            began = time.monotonic()
            await asyncio.sleep(0.2)
            late.append(time.monotonic() - began - 0.2)
        return statistics.mean(late) * 1000

    timer_ms = asyncio.run(overshoot())
    with tempfile.TemporaryDirectory(dir=scratch) as where:
        began = time.perf_counter()
        for index in range(300):  # a trial directory and a file in it, as an attempt has
            folder = Path(where, f"t{index}")
            folder.mkdir()
            (folder / "trajectory.json").write_bytes(b"x" * 500)
        create_us = (time.perf_counter() - began) / 300 * 1e6
    cpus = len(os.sched_getaffinity(0))
    split = "not split (off)" if switched_off() else "not split" if cpus < 2 else "split"
    table.add(
        "machine: a 200 ms timer; a file made",
        f"+{timer_ms:.1f} ms late; {cpus} CPUs, loop and servers {split}",
        f"{create_us:.0f} us for a folder and a file in {scratch or tempfile.gettempdir()}",
        "",
        (load, os.getloadavg()[0]),
    )


def case_a(table: Table, scratch: str | None) -> None:
    with FakeModelServer() as model:
        bare = run_bare(model, 2000, 64)
        run = run_engine(model, 2000, 64, scratch)
    load = (min(bare.load[0], run.load[0]), max(bare.load[1], run.load[1]))
    table.add(
        "(a) 0 ms, c=64, 2,000: attempts/s",
        f"{run.attempts_per_s:.0f}",
        f"bare aiohttp {bare.attempts_per_s:.0f} calls/s",
        f"{run.attempts_per_s / bare.attempts_per_s:.2f}x (>= 900/s)",
        load,
    )
    total = run.engine_cpu_ms + run.rollout_cpu_ms
    table.add(
        "(a)   CPU ms/attempt engine+rollout",
        f"{run.engine_cpu_ms:.2f} + {run.rollout_cpu_ms:.2f} = {total:.2f}",
        f"bare aiohttp {bare.cpu_ms:.2f} ms/call",
        f"{total / bare.cpu_ms:.1f}x (<= 1.5 ms)",
        load,
    )


def latency_case(
    table: Table,
    label: str,
    latency: float,
    attempts: int,
    concurrency: int,
    target: float,
    args: argparse.Namespace,
) -> EngineRun:
    """Dispatch / ideal of `--repeat` runs (each beside a bare client's run, alternating): one
    run moves by a percent or two with the machine's neighbours, so the median is the figure
    and the range is shown beside it."""
    ideal = attempts / concurrency * latency
    runs: list[EngineRun] = []
    bares: list[BareRun] = []
    with FakeModelServer(latency=latency) as model:
        for _ in range(args.repeat):
            bares.append(run_bare(model, attempts, concurrency))
            runs.append(run_engine(model, attempts, concurrency, args.scratch))
    ours = sorted(run.dispatch_s / ideal for run in runs)
    bare = sorted(run.dispatch_s / ideal for run in bares)
    load = (min(r.load[0] for r in [*runs, *bares]), max(r.load[1] for r in [*runs, *bares]))
    table.add(
        f"{label} {latency * 1000:.0f} ms, c={concurrency}, {attempts:,}: dispatch/ideal",
        f"{statistics.median(ours) * ideal:.2f} s = {_spread(ours)}",
        f"bare aiohttp {_spread(bare)}; ideal {ideal:.2f} s",
        f"{statistics.median(ours):.3f}x (<= {target}x)",
        load,
    )
    # The mean over every attempt of a run moves far less with the neighbours than the span
    # from the first start to the last end: the figure to compare two versions by.
    over = statistics.median(run.mean_ms for run in runs) - latency * 1000
    bare_over = statistics.median(run.mean_ms for run in bares) - latency * 1000
    table.add(
        f"{label}   mean attempt over the model's {latency * 1000:.0f} ms",
        f"+{over:.1f} ms",
        f"bare aiohttp call +{bare_over:.1f} ms",
        f"+{over - bare_over:.1f} ms over bare",
        load,
    )
    # Which part of the span is the time between attempts (gaps), which their durations:
    # the run of the median span, beside the bare client's of the median span.
    mid = sorted(runs, key=lambda run: run.dispatch_s)[len(runs) // 2]
    bare_mid = sorted(bares, key=lambda run: run.dispatch_s)[len(bares) // 2]
    table.add(
        f"{label}   slot that ended last (median run)",
        str(mid.last_slot),
        f"bare aiohttp {bare_mid.last_slot}",
        f"{mid.dispatch_s / ideal:.3f}x",
        load,
    )
    return max(runs, key=lambda run: run.engine_peak_mib + run.rollout_peak_mib)


def _spread(ratios: list[float]) -> str:
    """'1.089x' for one run; 'median 1.089x (1.083-1.102, 5 runs)' for several."""
    if len(ratios) == 1:
        return f"{ratios[0]:.3f}x"
    middle = statistics.median(ratios)
    return f"median {middle:.3f}x ({ratios[0]:.3f}-{ratios[-1]:.3f}, {len(ratios)} runs)"


def case_c(table: Table, args: argparse.Namespace) -> None:
    run = latency_case(table, "(c)", 1.0, 5000, 512, 1.15, args)
    table.add(
        "(c)   peak RSS engine + rollout",
        f"{run.engine_peak_mib:.0f} + {run.rollout_peak_mib:.0f} MiB",
        "",
        f"{run.engine_peak_mib + run.rollout_peak_mib:.0f} MiB (<= 300 MiB)",
        run.load,
    )


def case_d(table: Table, scratch: str | None) -> None:
    with FakeModelServer() as model:
        small = run_engine(model, 500, 64, scratch)
        large = run_engine(model, 10_000, 64, scratch)
    table.add(
        "(d) rollout peak RSS, 500 vs 10,000",
        f"{large.rollout_peak_mib:.1f} MiB",
        f"{small.rollout_peak_mib:.1f} MiB at 500",
        f"{large.rollout_peak_mib / (small.rollout_peak_mib or float('nan')):.2f}x (<= 1.1x)",
        (small.load[0], large.load[1]),
    )
    table.add(
        "(d)   engine peak RSS, 500 vs 10,000",
        f"{large.engine_peak_mib:.1f} MiB",
        f"{small.engine_peak_mib:.1f} MiB at 500",
        f"{large.engine_peak_mib / small.engine_peak_mib:.2f}x",
        (small.load[0], large.load[1]),
    )


def case_replicas(table: Table, scratch: str | None, sample: bool) -> None:
    with FakeModelServer() as model:
        runs = {}
        for replicas in (1, 2):
            runs[replicas] = run = run_engine(model, 2000, 64, scratch, replicas=replicas)
            table.add(
                f"replicas {replicas}, 0 ms, c=64, 2,000",
                f"{run.attempts_per_s:.0f} attempts/s",
                f"CPU {run.engine_cpu_ms:.2f} + {run.rollout_cpu_ms:.2f} ms/attempt",
                "",
                run.load,
            )
        large = run_engine(model, 2000, 64, scratch, rows=100_000)
        base = runs[1].engine_peak_mib
        table.add(
            "2,000 of a 100,000-row dataset",
            f"engine peak RSS {large.engine_peak_mib:.1f} MiB",
            f"{base:.1f} MiB from 2,000 rows",
            f"{large.engine_peak_mib / base:.2f}x",
            large.load,
        )
        if sample:
            sampled = run_engine(model, 10_000, 64, scratch, rows=100_000)
            table.add(
                "10 % sample of 100,000 rows",
                f"engine peak RSS {sampled.engine_peak_mib:.1f} MiB",
                f"{base:.1f} MiB from 2,000 rows",
                f"{sampled.engine_peak_mib / base:.2f}x; {sampled.attempts_per_s:.0f} att/s",
                sampled.load,
            )


CASES: dict[str, Callable[[Table, argparse.Namespace], object]] = {
    "a": lambda table, args: case_a(table, args.scratch),
    "b": lambda table, args: latency_case(table, "(b)", 0.2, 500, 64, 1.1, args),
    "c": lambda table, args: case_c(table, args),
    "d": lambda table, args: case_d(table, args.scratch),
    "replicas": lambda table, args: case_replicas(table, args.scratch, args.sample),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cases", default=",".join(CASES), help="comma-separated: a,b,c,d,replicas"
    )
    parser.add_argument("--scratch", help="directory for workspaces and run directories")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="(b) and (c): runs of each; the median is the figure, the range beside it",
    )
    parser.add_argument(
        "--sample", action="store_true", help="replicas: also the 10 %% sample of 100,000 rows"
    )
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    table = Table()
    machine_row(table, args.scratch)
    for name in args.cases.split(","):
        CASES[name.strip()](table, args)
    table.print()


if __name__ == "__main__":
    main()
