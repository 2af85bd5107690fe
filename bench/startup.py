"""How fast the `osmosis` command answers: `--help` and `--version` against a bare interpreter.

    .venv/bin/python bench/startup.py [--runs 7]

Prints the median wall time of each and its ratio to `python -c pass` measured in the same run.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, bench/ comes first on sys.path, and bench/platform.py would shadow the
# standard library's `platform` (which aiohttp, httpx and uuid import).
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]
# ruff: noqa: E402

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

OSMOSIS = str(Path(sys.executable).with_name("osmosis"))


def median_seconds(command: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    runs = parser.parse_args().runs
    baseline = median_seconds([sys.executable, "-c", "pass"], runs)
    print(f"{'command':<24}{'median s':>10}{'x bare python':>16}")
    print(f"{'python -c pass':<24}{baseline:>10.3f}{1.0:>16.1f}")
    for args in (["--help"], ["--version"], ["dev", "--help"]):
        seconds = median_seconds([OSMOSIS, *args], runs)
        label = "osmosis " + " ".join(args)
        print(f"{label:<24}{seconds:>10.3f}{seconds / baseline:>16.1f}")


if __name__ == "__main__":
    main()
