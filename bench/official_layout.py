"""What filling `rollout_trials/` for the official `eval upload` costs per recorded attempt.

    .venv/bin/python bench/official_layout.py [--attempts N] [--steps S] [--scratch DIR]

Each recorded attempt now also gets `rollout_trials/<id>/trajectory.json` (an ATIF-conformant
copy of its trajectory: ours carries per-call figures ATIF has no key for) and hard links to
its kept artifacts. Measured in the same run: `RunDirectory.record` of N attempts (trajectory
of S steps, two artifact files, fsync per record, as `eval run` writes them), and
`mirror_trial` alone over the same files; the ratio is the share of recording the mirror is.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, bench/ comes first on sys.path, and bench/platform.py would shadow the
# standard library's `platform` (which uuid imports).
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]
# ruff: noqa: E402

import argparse
import os
import tempfile
import time
import uuid
from datetime import UTC, datetime

from osmosis.eval.host.run_dir import RunDirectory, Slots
from osmosis.eval.results.official_layout import mirror_trial
from osmosis.eval.results.records import AttemptRecord, FinishedAttempt


def _trajectory(rollout_id: str, steps: int) -> dict:
    return {
        "schema_version": "ATIF-v1.7",
        "session_id": rollout_id,
        "steps": [
            {"step_id": i, "source": "agent", "message": "x" * 400,
             "metrics": {"prompt_tokens": 30, "completion_tokens": 5, "latency_ms": 1.25}}
            for i in range(steps)
        ],
        "final_metrics": {"total_steps": steps, "total_policy_calls": steps},
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--attempts", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--scratch", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.scratch) as scratch:
        root = Path(scratch) / "run"
        attempts = []
        for i in range(args.attempts):
            rollout_id = uuid.uuid4().hex
            trial = root / "rollout_trials" / rollout_id / "artifacts"
            trial.mkdir(parents=True)
            (trial / "a.txt").write_text("artifact " * 50)
            (trial / "b.bin").write_bytes(os.urandom(4096))
            record = AttemptRecord(row_index=i, run_index=0, rollout_id=rollout_id,
                                   source_row_index=i, status="success", reward=1.0,
                                   duration_ms=1.0, trajectory_filename="trajectory.json",
                                   finished_at=datetime.now(UTC))  # fmt: skip
            attempts.append(FinishedAttempt(record=record,
                                            trajectory=_trajectory(rollout_id, args.steps),
                                            trial_dir=trial.parent))  # fmt: skip
        slots = Slots(rows=args.attempts, n=1)
        inputs = {"model_path": "openai/m", "n": 1, "pass_threshold": 1.0}
        with RunDirectory.open(root, slots=slots, inputs=inputs, provenance={}) as run:
            began = time.perf_counter()
            for attempt in attempts:
                run.record(attempt)
            recording = time.perf_counter() - began
        began = time.perf_counter()
        for attempt in attempts:
            stem = f"row_{attempt.record.row_index}_run_0"
            trajectory = root / "trajectories" / f"{stem}.json"
            kept = root / "artifacts" / stem
            mirror_trial(root, attempt.record, trajectory=trajectory,
                         document=attempt.trajectory, artifacts=kept)  # fmt: skip
        mirroring = time.perf_counter() - began
    n = args.attempts
    print(f"attempts {n}, {args.steps} steps each, load {os.getloadavg()[0]:.2f}")
    print(f"record (includes the mirror): {recording / n * 1e6:8.1f} us/attempt")
    print(f"mirror_trial alone:           {mirroring / n * 1e6:8.1f} us/attempt")
    print(f"mirror / record:              {mirroring / recording:8.2f}")


if __name__ == "__main__":
    main()
