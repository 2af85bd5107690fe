"""Time to the first result: the fixed cost of `osmosis eval run` by phase, on every path.

    .venv/bin/python bench/start.py [--cases fixed,sandbox,latency,platform] [--repeat 5]

Every figure is set beside a limit measured in the same run (issue 30):

  fixed     a 1-row `eval run` (scripted model, 0 ms): the whole command, and its phases
            read from the run's own log and journal (`logs.txt` stamps each line):
              start      interpreter, imports, config and dataset, run directory; the
                         rollout server starts alongside (spawned at the command's entry,
                         `osmosis.cli.prestart`)
              bridge     the model bridge, the environment check
              servers    what is left of the rollout server's start once the run asks for
                         it (the model's pre-flight runs alongside)
              dispatch   server healthy → the first attempt sent
              attempts   the first attempt sent → the last one recorded
              exit       the last record → the process gone (outputs, servers stopped)
            against a bare client's whole command: the interpreter, aiohttp and one chat
            call (`bench/engine.py`'s client). Fixed cost = whole - attempts.
            Beside it, the same run without the early start (`--output` given, the same
            directory: the server then starts when the run asks for it, as before).
            Beside it, the rollout server's own start outside the engine: `python main.py`
            spawned → `GET /health` 200, against a bare FastAPI app on uvicorn (the same
            imports, one `/health` route) started the same way.
  sandbox   the same run with `--sandbox` (the bubblewrap site) against it unsandboxed
            without the early start, alternated run by run: the servers phase's
            difference, round by round.
  latency   200 ms model latency, 500 rows, 64 in flight: the whole command against the
            ideal (rows / concurrency x latency), the bare client's whole command beside.
  platform  the embedded platform (`server start --detach`), the same 1-row workspace with
            its environment cached by a first run: `eval submit` → first attempt recorded,
            and → finished, against `eval run`'s whole command. Submitted once the platform
            is idle (its warm spare worker started and done importing), as a user finds it;
            alternated with a submit right after the previous run ended, while the spare
            that run started still imports (~1 s of CPU, beside the command's own ~0.8 s on
            2 cores): the command's time both ways. The idle runs' phases, from the run's
            `logs.txt` and journal (seconds from the command's start to the claim, then each
            from the one before):
              claimed    the submit command up to its POST, the scheduler's claim
              worker     the claim → the worker (a warm spare) took the run
              prepare    checkout, dataset copy, plan, run directory ("work items pending")
              server     the rollout server's start (in the sandbox) → healthy
              recorded   healthy → the first attempt ended (journal)
              visible    → the API showed it (the database write, the bench's 20 ms poll)

The Ray executor's per-attempt figures are `bench/ray.py --cases overhead`.
Median of `--repeat` runs, the range beside it; the load average is printed: 2 shared
cores, so a figure taken under load says more about the neighbours than about osmosis.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, bench/ comes first on sys.path, and bench/platform.py would shadow the
# standard library's `platform` (which aiohttp, httpx and uuid import).
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
# ruff: noqa: E402

import argparse
import http.client
import importlib.util
import json
import os
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from types import ModuleType

from osmosis.testing import FakeModelServer

CLI = [sys.executable, "-c", "from osmosis.cli.main import run; run()"]
PHASES = ("start", "bridge", "servers", "dispatch", "attempts", "exit")
PLATFORM_PHASES = ("claimed", "worker", "prepare", "server", "recorded", "visible")

# The limit for the rollout server's start: what any FastAPI app on uvicorn needs to answer.
BARE_SERVER = """
import os
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse

app = FastAPI()

@app.get("/health")
async def health() -> JSONResponse:
    return JSONResponse({"status": "ok"})

uvicorn.run(app, host="127.0.0.1", port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]),
            log_level="warning", access_log=False)
"""


def _bench_module(name: str) -> ModuleType:
    """A sibling bench script as a module (not by import: bench/ is kept off sys.path)."""
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


engine = _bench_module("engine")


def _stamp(line: str) -> float:
    return datetime.fromisoformat(line.split(" ", 1)[0]).timestamp()


def phases(run_dir: Path, began: float, ended: float) -> dict[str, float]:
    """Seconds of each phase of one run, from its log's stamps and its journal."""
    marks: dict[str, float] = {}
    for line in (run_dir / "logs.txt").read_text().splitlines():
        text = line.split(" ", 1)[1]
        if "work items pending" in text and "pending" not in marks:
            marks["pending"] = _stamp(line)
        elif text.startswith("starting rollout server") and "starting" not in marks:
            marks["starting"] = _stamp(line)
        elif text.startswith("rollout server") and "healthy at" in text:
            marks["healthy"] = _stamp(line)
    records = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    ends = [datetime.fromisoformat(r["finished_at"]).timestamp() for r in records]
    starts = [end - r["duration_ms"] / 1000 for end, r in zip(ends, records, strict=True)]
    first, last = min(starts), max(ends)
    return {
        "start": marks["pending"] - began,
        "bridge": marks["starting"] - marks["pending"],
        "servers": marks["healthy"] - marks["starting"],
        "dispatch": first - marks["healthy"],
        "attempts": last - first,
        "exit": ended - last,
    }


def platform_phases(run_dir: Path, began: float, visible: float) -> dict[str, float]:
    """Seconds of each phase of one platform run (`PLATFORM_PHASES`), from its log's stamps
    and its journal; `began` is the submit command's start, `visible` when the API showed
    the first attempt."""
    marks: dict[str, float] = {}
    for line in (run_dir / "logs.txt").read_text().splitlines():
        text = line.split(" ", 1)[1]
        for mark, words in (
            ("claimed", "[platform] claimed by"),
            ("worker", "started by the platform"),
            ("pending", "work items pending"),
            ("starting", "starting rollout server"),
            ("healthy", "healthy at"),
        ):
            if words in text and mark not in marks:
                marks[mark] = _stamp(line)
    records = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    recorded = min(datetime.fromisoformat(r["finished_at"]).timestamp() for r in records)
    return {
        "claimed": marks["claimed"] - began,
        "worker": marks["worker"] - marks["claimed"],
        "prepare": marks["pending"] - marks["worker"],
        "server": marks["healthy"] - marks["starting"],
        "recorded": recorded - marks["healthy"],
        "visible": visible - recorded,
    }


def _cpu_ticks(pid: int) -> int | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])  # utime + stime


def platform_idle(home: Path, timeout: float = 20.0) -> bool:
    """Wait until the server's warm spare worker (`run_worker --warm`, its child) has
    started and stopped using CPU for 0.3 s; False when none did within `timeout`."""
    server = json.loads((home / "server.json").read_text())["pid"]
    last: tuple[int, int | None] | None = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        spare = None
        for entry in Path("/proc").iterdir():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(stat[1]) == server and b"--warm" in (entry / "cmdline").read_bytes():
                    spare = int(entry.name)
            except (OSError, ValueError):
                continue
        now = (spare, _cpu_ticks(spare)) if spare is not None else None
        if now is not None and now == last:
            return True
        last = now
        time.sleep(0.3)
    return False


def eval_run(workdir: Path, model: FakeModelServer, name: str, *extra: str) -> dict[str, float]:
    """One `eval run` of the workspace in `workdir`: its whole wall time and its phases."""
    env = {**os.environ, "OPENAI_API_BASE": model.base_url, "OPENAI_API_KEY": "sk-bench"}
    command = [*CLI, "eval", "run", "configs/eval/bench.toml", "--name", name, "-y", *extra]
    began = time.time()
    done = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True)
    ended = time.time()
    if done.returncode != 0:
        raise SystemExit(f"eval run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    figures = phases(workdir / ".osmosis" / "evals" / name, began, ended)
    figures["whole"] = ended - began
    figures["fixed"] = figures["whole"] - figures["attempts"]
    return figures


def bare_client(model: FakeModelServer, calls: int, concurrency: int) -> float:
    """The whole command of the bare client making `calls` chat calls."""
    began = time.time()
    subprocess.run(
        [sys.executable, "-c", engine.BARE_CLIENT, model.base_url, str(calls), str(concurrency)],
        capture_output=True,
        check=True,
    )
    return time.time() - began


def server_start(command: list[str], cwd: Path) -> float:
    """Seconds from spawning a server on `_OSMOSIS_ROLLOUT_PORT` to its `GET /health` 200,
    asked every 2 ms (as the engine does once told the server is ready)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "_OSMOSIS_ROLLOUT_PORT": str(port)}
    began = time.perf_counter()
    child = subprocess.Popen(command, cwd=cwd, env=env, stderr=subprocess.PIPE)
    try:
        while child.poll() is None:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            try:
                connection.request("GET", "/health")
                if connection.getresponse().status == 200:
                    return time.perf_counter() - began
            except OSError:
                time.sleep(0.002)
            finally:
                connection.close()
        assert child.stderr is not None
        raise SystemExit(f"{command} exited {child.returncode}:\n{child.stderr.read()[-3000:]!r}")
    finally:
        child.terminate()
        child.communicate()


def median_of(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def spread(values: list[float]) -> str:
    return f"{min(values):.3f}-{max(values):.3f}"


class Table:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str]] = []

    def add(self, case: str, figure: str, limit: str, ratio: str) -> None:
        self.rows.append((case, figure, limit, ratio))
        print(f"  {case}: {figure} | {limit} | {ratio}", file=sys.stderr, flush=True)

    def print(self) -> None:
        print(f"\nload average at the end: {os.getloadavg()[0]:.2f} (2 cores)")
        header = ("case", "osmosis", "limit (same run)", "ratio (target)")
        widths = [max(len(r[i]) for r in [header, *self.rows]) for i in range(4)]
        for row in [header, *self.rows]:
            print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))


def one_row_workspace(root: Path) -> Path:
    """The engine bench's one-call rollout with 4 rows (the dataset minimum), 1 of them run."""
    engine.make_workspace(root, 4, 1)
    return root


def case_fixed(table: Table, repeat: int, extra: tuple[str, ...] = ()) -> list[dict[str, float]]:
    label = "eval run --sandbox" if extra else "eval run"
    runs: list[dict[str, float]] = []
    lates: list[dict[str, float]] = []  # no early start: --output names the same root
    bares: list[float] = []
    starts: list[float] = []
    bare_starts: list[float] = []
    with FakeModelServer() as model, tempfile.TemporaryDirectory() as scratch:
        workdir = one_row_workspace(Path(scratch))
        eval_run(workdir, model, "warm", *extra)  # the page cache, the environment check
        for index in range(repeat):
            bares.append(bare_client(model, 1, 1))
            runs.append(eval_run(workdir, model, f"run{index}", *extra))
            if not extra:
                late = ("--output", ".osmosis/evals")
                lates.append(eval_run(workdir, model, f"late{index}", *late))
                rollout = workdir / "rollouts" / "bench"
                starts.append(server_start([sys.executable, "main.py"], rollout))
                bare_starts.append(server_start([sys.executable, "-c", BARE_SERVER], workdir))
    bare = statistics.median(bares)
    whole = median_of(runs, "whole")
    table.add(
        f"{label}, 1 row: whole command",
        f"{whole:.3f} s ({spread([r['whole'] for r in runs])})",
        f"bare client {bare:.3f} s",
        f"{whole / bare:.1f}x (<= 3x)",
    )
    fixed = median_of(runs, "fixed")
    table.add(
        f"{label}, 1 row: fixed cost",
        f"{fixed:.3f} s",
        f"bare client {bare:.3f} s",
        f"{'<=' if fixed <= 0.6 else '>'} 0.6 s target",
    )
    for phase in PHASES:
        table.add(f"  phase {phase}", f"{median_of(runs, phase):.3f} s", "", "")
    if lates:
        late = median_of(lates, "whole")
        table.add(
            "  without the early server start: whole",
            f"{late:.3f} s ({spread([r['whole'] for r in lates])})",
            f"phases start {median_of(lates, 'start'):.3f} s, "
            f"servers {median_of(lates, 'servers'):.3f} s",
            f"early start {whole / late:.2f}x of it, {(whole - late) * 1000:+.0f} ms",
        )
    if starts:
        start, bare_start = statistics.median(starts), statistics.median(bare_starts)
        table.add(
            "rollout server start: spawn → /health 200",
            f"{start:.3f} s ({spread(starts)})",
            f"bare FastAPI server {bare_start:.3f} s ({spread(bare_starts)})",
            f"{start / bare_start:.2f}x, {(start - bare_start) * 1000:+.0f} ms",
        )
    return runs


def case_sandbox(table: Table, repeat: int) -> None:
    """`eval run --sandbox` against the same run unsandboxed, alternated run by run in one
    workspace (a load spike touches both sides of a round), each side warmed once. Both sides
    name `--output` (the default root): their servers then start when the run asks for them,
    not at the command's entry (`cli.prestart`), so the servers phase is the sandbox's own
    cost. Beside it, both sides as a user runs them (servers started at the entry; the
    sandboxed one as a spare its site adopts): the whole commands."""
    plain: list[dict[str, float]] = []
    boxed: list[dict[str, float]] = []
    plain_early: list[dict[str, float]] = []
    boxed_early: list[dict[str, float]] = []
    late = ("--output", ".osmosis/evals")
    with FakeModelServer() as model, tempfile.TemporaryDirectory() as scratch:
        workdir = one_row_workspace(Path(scratch))
        eval_run(workdir, model, "warm", *late)
        eval_run(workdir, model, "warm-boxed", "--sandbox", *late)
        for index in range(repeat):
            plain.append(eval_run(workdir, model, f"plain{index}", *late))
            boxed.append(eval_run(workdir, model, f"boxed{index}", "--sandbox", *late))
            plain_early.append(eval_run(workdir, model, f"plain-early{index}"))
            boxed_early.append(eval_run(workdir, model, f"boxed-early{index}", "--sandbox"))
    load = f"load {os.getloadavg()[0]:.1f}"
    whole, base = median_of(boxed, "whole"), median_of(plain, "whole")
    table.add(
        "eval run --sandbox, 1 row: whole command",
        f"{whole:.3f} s ({spread([r['whole'] for r in boxed])})",
        f"unsandboxed {base:.3f} s ({spread([r['whole'] for r in plain])})",
        f"{(whole - base) * 1000:+.0f} ms",
    )
    for phase in PHASES:
        table.add(
            f"  phase {phase}",
            f"{median_of(boxed, phase):.3f} s",
            f"unsandboxed {median_of(plain, phase):.3f} s",
            "",
        )
    rounds = [b["servers"] - p["servers"] for p, b in zip(plain, boxed, strict=True)]
    extra = statistics.median(rounds)
    table.add(
        "sandbox start over unsandboxed (servers phase)",
        f"{extra * 1000:+.0f} ms (median of {repeat} rounds; medians' difference "
        f"{(median_of(boxed, 'servers') - median_of(plain, 'servers')) * 1000:+.0f} ms)",
        f"unsandboxed {median_of(plain, 'servers'):.3f} s; rounds "
        + " ".join(f"{r * 1000:+.0f}" for r in rounds),
        f"{'<=' if extra <= 0.05 else '>'} 50 ms target ({load})",
    )
    whole, base = median_of(boxed_early, "whole"), median_of(plain_early, "whole")
    table.add(
        "eval run --sandbox, servers started at the entry",
        f"{whole:.3f} s ({spread([r['whole'] for r in boxed_early])})",
        f"unsandboxed {base:.3f} s ({spread([r['whole'] for r in plain_early])})",
        f"{(whole - base) * 1000:+.0f} ms",
    )


def case_latency(table: Table, repeat: int) -> None:
    rows, concurrency, latency = 500, 64, 0.2
    ideal = rows / concurrency * latency
    runs: list[dict[str, float]] = []
    bares: list[float] = []
    with FakeModelServer(latency=latency) as model, tempfile.TemporaryDirectory() as scratch:
        workdir = Path(scratch)
        engine.make_workspace(workdir, rows)
        eval_run(workdir, model, "warm", "--max-in-flight", str(concurrency))
        for index in range(repeat):
            bares.append(bare_client(model, rows, concurrency))
            runs.append(eval_run(workdir, model, f"run{index}", "--max-in-flight", "64"))
    whole = median_of(runs, "whole")
    bare = statistics.median(bares)
    table.add(
        f"eval run {latency * 1000:.0f} ms, {rows} rows, c={concurrency}: whole",
        f"{whole:.2f} s ({spread([r['whole'] for r in runs])})",
        f"ideal {ideal:.2f} s; bare client {bare:.2f} s = {bare / ideal:.2f}x",
        f"{whole / ideal:.2f}x (<= 1.6x)",
    )
    table.add(
        "  its dispatch (first start → last end)",
        f"{median_of(runs, 'attempts'):.2f} s",
        f"ideal {ideal:.2f} s",
        f"{median_of(runs, 'attempts') / ideal:.3f}x (<= 1.1x)",
    )
    # Where the rest of the whole command goes: the fixed cost at 500 rows, phase by phase.
    for phase in PHASES:
        if phase != "attempts":
            table.add(f"  phase {phase}", f"{median_of(runs, phase):.3f} s", "", "")


def case_platform(table: Table, repeat: int) -> None:
    platform = _bench_module("platform")
    from osmosis.client import PlatformClient
    from osmosis.vocabulary import TERMINAL_RUN_STATUSES

    with FakeModelServer() as model, tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        tree = platform.make_workspace(root, 4, 4)
        config = tree / "configs" / "eval" / "bench.toml"
        config.write_text(config.read_text().replace("limit = 4", "limit = 1"))
        platform.git("commit", "-qam", "one row", cwd=tree)
        platform.git("push", "-q", cwd=tree)
        env = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS_")}
        env.update(
            OPENAI_API_BASE=model.base_url,
            OPENAI_API_KEY="sk-bench",
            OSMOSIS_HOME=str(root / "home"),
            OSMOSIS_CONFIG_DIR=str(root / "config"),
        )
        local = [eval_run(tree, model, f"local{i}") for i in range(repeat)]
        platform.osmosis("server", "start", "--detach", "--port", str(platform.free_port()),
                         cwd=root, env=env)  # fmt: skip
        try:
            platform.osmosis("dataset", "upload", "data/bench.jsonl", "-y", cwd=tree, env=env)
            credentials = json.loads((root / "home" / "credentials.json").read_text())
            firsts: list[float] = []
            finishes: list[float] = []
            submits: list[float] = []
            busy_submits: list[float] = []
            busy_firsts: list[float] = []
            splits: list[dict[str, float]] = []
            with PlatformClient(credentials["platform_url"], credentials["token"]) as client:
                # The first one builds the environment; then idle and busy rounds alternate.
                for index in range(2 * repeat + 1):
                    idle = index % 2 == 1
                    if idle and not platform_idle(root / "home"):
                        raise SystemExit("the platform's warm spare worker did not settle")
                    began = time.time()
                    out = platform.osmosis("--json", "eval", "submit", "configs/eval/bench.toml",
                                           "-y", cwd=tree, env=env)  # fmt: skip
                    submitted = time.time() - began
                    name = json.loads(out)["resource"]["name"]
                    run_id = json.loads(out)["resource"]["id"]
                    first = None
                    while True:
                        detail = client.runs.get(name)
                        if first is None and detail.eval_run.summary.progress.completed > 0:
                            first = time.time() - began
                            shown = time.time()
                        if detail.eval_run.status in TERMINAL_RUN_STATUSES:
                            break
                        time.sleep(0.02)
                    if detail.eval_run.status != "finished":
                        raise SystemExit(f"platform run {name} ended {detail.eval_run.status}")
                    if index and not idle:
                        busy_submits.append(submitted)
                        busy_firsts.append(first if first is not None else time.time() - began)
                    elif index:
                        submits.append(submitted)
                        firsts.append(first if first is not None else time.time() - began)
                        finishes.append(time.time() - began)
                        if first is not None:
                            run_dir = root / "home" / "runs" / run_id
                            splits.append(platform_phases(run_dir, began, shown))
        finally:
            platform.osmosis("server", "stop", cwd=root, env=env)
    whole = median_of(local, "whole")
    table.add(
        "platform: eval submit command",
        f"{statistics.median(submits):.3f} s ({spread(submits)})",
        f"eval run whole {whole:.3f} s",
        "",
    )
    table.add(
        "  right after a run (spare importing)",
        f"{statistics.median(busy_submits):.3f} s ({spread(busy_submits)})",
        "idle submit",
        f"{statistics.median(busy_submits) / statistics.median(submits):.2f}x",
    )
    table.add(
        "  right after a run: → first attempt recorded",
        f"{statistics.median(busy_firsts):.3f} s ({spread(busy_firsts)})",
        "idle submit's",
        f"{statistics.median(busy_firsts) / statistics.median(firsts):.2f}x",
    )
    table.add(
        "platform: submit → first attempt recorded",
        f"{statistics.median(firsts):.3f} s ({spread(firsts)})",
        f"eval run whole {whole:.3f} s",
        f"{'<=' if statistics.median(firsts) <= 1.5 else '>'} 1.5 s target",
    )
    table.add(
        "platform: submit → finished (1 row)",
        f"{statistics.median(finishes):.3f} s ({spread(finishes)})",
        f"eval run whole {whole:.3f} s",
        f"{statistics.median(finishes) / whole:.2f}x",
    )
    for phase in PLATFORM_PHASES if splits else ():
        values = [split[phase] for split in splits]
        table.add(
            f"  phase {phase}", f"{statistics.median(values):.3f} s ({spread(values)})", "", ""
        )


CASES: dict[str, Callable[[Table, int], object]] = {
    "fixed": case_fixed,
    "sandbox": case_sandbox,
    "latency": case_latency,
    "platform": case_platform,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    table = Table()
    for case in args.cases.split(","):
        CASES[case](table, args.repeat)
    table.print()


if __name__ == "__main__":
    main()
