"""Two versions of osmosis on one case of `bench/engine.py`, in alternating rounds.

    .venv/bin/python bench/ab.py --against HEAD~1 [--case b] [--rounds 14]

A: the version at `--against` (any git revision); B: this checkout's `src/`, uncommitted
changes included. Each round runs A and B on the same scripted model, then the bare aiohttp
client; the order of A and B flips every round, so a drift of the machine's speed during the
rounds falls on both. It prints each side's median and range, and B's difference to A.

Why rounds: a change to dispatch is often worth a point of (b) or less, and one run of (b)
moves by a point or two with the machine's neighbours (2 shared cores). Two medians of
`bench/engine.py` taken minutes apart can differ by more than the change; alternated rounds
measure both under the same conditions. Even so, 14 rounds of (b) still swing by about a point
from one try to the next: a difference below that is not a result.

A runs from a temporary `git worktree` of the revision, through `PYTHONPATH=<worktree>/src`:
its engine and the rollout server it spawns (which inherits the variable: the bench's
workspace has no environment of its own). The worktree is removed at the end.

Cases:
  a  0 ms latency, concurrency 64, 2,000 attempts: attempts/s and engine CPU ms per attempt.
  b  200 ms latency, concurrency 64, 500 attempts: dispatch / ideal, and an attempt's mean
     duration over the model's latency (the steadier of the two).
  c  1 s latency, concurrency 512, 5,000 attempts: the same two figures.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, bench/ comes first on sys.path; bench/platform.py would shadow the standard
# library's `platform`. bench/engine.py is imported as a module of its own directory.
_BENCH = Path(__file__).parent.resolve()
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _BENCH]
sys.path.insert(0, str(_BENCH.parent))
# ruff: noqa: E402

import argparse
import contextlib
import os
import statistics
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from bench.engine import EngineRun, run_bare, run_engine

from osmosis.testing import FakeModelServer


@dataclass(frozen=True)
class Case:
    latency: float
    attempts: int
    concurrency: int
    # (name, figure of one run, whether higher is better)
    figures: tuple[tuple[str, Callable[[EngineRun, float], float], bool], ...]


def _dispatch(run: EngineRun, ideal: float) -> float:
    return run.dispatch_s / ideal


def _mean_over(latency: float) -> Callable[[EngineRun, float], float]:
    return lambda run, ideal: run.mean_ms - latency * 1000


CASES = {
    "a": Case(
        0.0,
        2000,
        64,
        (
            ("attempts/s", lambda run, ideal: run.attempts_per_s, True),
            ("engine CPU ms/attempt", lambda run, ideal: run.engine_cpu_ms, False),
        ),
    ),
    "b": Case(
        0.2,
        500,
        64,
        (("dispatch/ideal", _dispatch, False), ("mean ms over 200 ms", _mean_over(0.2), False)),
    ),
    "c": Case(
        1.0,
        5000,
        512,
        (("dispatch/ideal", _dispatch, False), ("mean ms over 1 s", _mean_over(1.0), False)),
    ),
}


@contextlib.contextmanager
def worktree(revision: str) -> Iterator[Path]:
    """A detached checkout of `revision`, compiled, removed afterwards."""
    repo = _BENCH.parent
    with tempfile.TemporaryDirectory(prefix="osmosis-ab-") as parent:
        tree = Path(parent) / "tree"
        git = ["git", "-C", str(repo)]
        added = subprocess.run(
            [*git, "worktree", "add", "--detach", "--quiet", str(tree), revision], check=False
        )
        if added.returncode != 0:  # git said why on stderr
            raise SystemExit(f"bench/ab.py: cannot check out --against {revision!r}")
        try:
            subprocess.run(
                [sys.executable, "-m", "compileall", "-q", str(tree / "src")],
                check=True,
                env={**os.environ, "PYTHONDONTWRITEBYTECODE": ""},
            )
            yield tree
        finally:
            subprocess.run([*git, "worktree", "remove", "--force", str(tree)], check=False)


def imported_from(env: dict[str, str]) -> str:
    """Where `import osmosis` resolves under `env`: the check that A runs A's code."""
    return subprocess.run(
        [sys.executable, "-c", "import osmosis; print(osmosis.__file__)"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def _spread(values: list[float]) -> str:
    ordered = sorted(values)
    return f"median {statistics.median(ordered):.3f} ({ordered[0]:.3f}-{ordered[-1]:.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", required=True, help="git revision of A, e.g. HEAD or main~2")
    parser.add_argument("--case", choices=sorted(CASES), default="b")
    parser.add_argument("--rounds", type=int, default=14, help="rounds of A, B and bare")
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error(f"--rounds must be at least 2 (the order alternates), got {args.rounds}")
    case = CASES[args.case]
    ideal = case.attempts / case.concurrency * case.latency
    with worktree(args.against) as tree:
        sides = {"A": {"PYTHONPATH": str(tree / "src")}, "B": {}}
        where = imported_from(sides["A"])
        if not where.startswith(str(tree)):
            raise SystemExit(f"A would import osmosis from {where}, not from {tree}")
        print(f"A: {args.against} ({where})\nB: this checkout ({imported_from(sides['B'])})")
        runs: dict[str, list[EngineRun]] = {"A": [], "B": []}
        bare: list[float] = []
        with FakeModelServer(latency=case.latency) as model:
            for round_ in range(args.rounds):
                for side in ("A", "B") if round_ % 2 == 0 else ("B", "A"):
                    runs[side].append(
                        run_engine(model, case.attempts, case.concurrency, None, env=sides[side])
                    )
                if ideal:
                    bare.append(run_bare(model, case.attempts, case.concurrency).dispatch_s / ideal)
                print(f"  round {round_ + 1}/{args.rounds}", file=sys.stderr)
    print(
        f"case {args.case}: {case.latency * 1000:.0f} ms, c={case.concurrency}, "
        f"{case.attempts:,} attempts, {args.rounds} rounds"
    )
    for name, figure, higher_better in case.figures:
        a = [figure(run, ideal) for run in runs["A"]]
        b = [figure(run, ideal) for run in runs["B"]]
        change = statistics.median(b) - statistics.median(a)
        verdict = "same" if not change else "better" if (change > 0) == higher_better else "worse"
        print(f"  {name}: A {_spread(a)} | B {_spread(b)} | B-A {change:+.3f} ({verdict} for B)")
    if bare:
        print(f"  bare aiohttp dispatch/ideal: {_spread(bare)}")


if __name__ == "__main__":
    main()
