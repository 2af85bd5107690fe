"""Wall time of a platform run with its blobs in an object store versus a directory store.

    .venv/bin/python bench/object_store.py [--attempts 1000] [--concurrency 64] [--rounds 2]

The same workspace, config, dataset and scripted model (zero latency) run on both stores in
this one invocation, alternating for `--rounds` rounds, each on a fresh `osmosis server` (role
all) home: with the default directory store, and with `OSMOSIS_BLOB_URL` naming a bucket of
moto's S3-compatible server on loopback (a subprocess, as in tests/platform/
test_object_store.py). The wall time is from the submit to the terminal status seen by a
client polling every 0.25 s, so it includes what the object store adds: the dataset read
through the store, the run's files published as it goes, and the final publish before the
run is seen ending; each store's best round counts. Target: object / directory <= 1.2.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != HERE]
sys.path.insert(0, str(ROOT))  # tests.platform.object_store_world

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

from tests.platform.object_store_world import MotoServer  # noqa: E402

from osmosis.client import PlatformClient  # noqa: E402
from osmosis.testing import FakeModelServer  # noqa: E402
from osmosis.vocabulary import TERMINAL_RUN_STATUSES  # noqa: E402


def _bench_platform():  # type: ignore[no-untyped-def]
    """bench/platform.py (named like the standard library's module: loaded by path)."""
    spec = importlib.util.spec_from_file_location("bench_platform", HERE / "platform.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _bench_platform()


def timed_run(tree: Path, env: dict[str, str], root: Path) -> tuple[float, int, str]:
    """Start a server on `env`'s home, upload, submit; (wall seconds, attempts, status)."""
    bench.osmosis("server", "start", "--detach", "--port", str(bench.free_port()), cwd=root,
                  env=env)  # fmt: skip
    try:
        bench.osmosis("dataset", "upload", "data/bench.jsonl", "-y", cwd=tree, env=env)
        credentials = json.loads((Path(env["OSMOSIS_HOME"]) / "credentials.json").read_text())
        with PlatformClient(credentials["platform_url"], credentials["token"]) as client:
            command = ("--json", "eval", "submit", "configs/eval/bench.toml", "-y")
            submitted = json.loads(bench.osmosis(*command, cwd=tree, env=env))
            started = time.monotonic()
            name = submitted["resource"]["name"]
            while (detail := client.runs.get(name)).eval_run.status not in TERMINAL_RUN_STATUSES:
                time.sleep(0.25)
            wall = time.monotonic() - started
        return wall, detail.summary.progress.completed, detail.eval_run.status
    finally:
        bench.osmosis("server", "stop", cwd=root, env=env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2, help="runs on each store (default 2)")
    args = parser.parse_args()
    with (
        FakeModelServer() as model,
        tempfile.TemporaryDirectory() as scratch,
        MotoServer.start() as moto,
    ):
        root = Path(scratch)
        tree = bench.make_workspace(root, args.attempts, args.concurrency)
        base = {k: v for k, v in os.environ.items() if not k.startswith(("OSMOSIS_", "AWS_"))}
        base.update(OPENAI_API_BASE=model.base_url, OPENAI_API_KEY="sk-bench")

        def env(name: str, **extra: str) -> dict[str, str]:
            return {
                **base,
                "OSMOSIS_HOME": str(root / name / "home"),
                "OSMOSIS_CONFIG_DIR": str(root / name / "config"),
                **extra,
            }

        # Rounds alternate the two stores, so neither always runs on a colder machine; each
        # store's best round counts.
        directory: list[tuple[float, int, str]] = []
        objects: list[tuple[float, int, str]] = []
        stored = 0
        for round_ in range(args.rounds):
            directory.append(timed_run(tree, env(f"directory-{round_}"), root))
            url = moto.bucket(f"bench-{round_}")
            extra = {"OSMOSIS_BLOB_URL": url, **moto.env()}
            objects.append(timed_run(tree, env(f"object-{round_}", **extra), root))
            stored = len(moto.objects(url, "runs/"))
    print(f"{args.attempts} attempts, concurrency {args.concurrency}, scripted model, 0 latency")
    for label, walls in (("directory store", directory), ("object store", objects)):
        rounds = ", ".join(f"{wall:.2f}" for wall, _, _ in walls)
        done = {f"{attempts} attempts {status}" for _, attempts, status in walls}
        print(f"{label + ' wall s (best)':<40}{min(walls)[0]:>10.2f}   (rounds {rounds}; {done})")
    print(f"{'objects of one run in the store':<40}{stored:>10}")
    ratio = min(objects)[0] / min(directory)[0]
    print(f"{'object / directory':<40}{ratio:>10.2f}   (target <= 1.20)")


if __name__ == "__main__":
    main()
