"""The official osmosis-ai local-run layout: reading it, converting it to ours, and filling our
run directory's `rollout_trials/` so the official `eval upload` accepts it. (The official CLI
itself runs against these in tests/platform/test_official_run_layout.py.)"""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

from osmosis.eval.host.plan import _selection_digest
from osmosis.eval.inputs.dataset_select import Selection
from osmosis.eval.results import official_layout
from osmosis.eval.results.classify import enrich_trajectory
from osmosis.eval.results.records import AttemptRecord
from osmosis.eval.results.run_export import verify_run_dir
from osmosis.rollout.context import PolicyCall
from osmosis.rollout.trajectory import build_trajectory

A, B, C = "a" * 32, "b" * 32, "c" * 32
INTEROP_PYTHON = Path(__file__).resolve().parents[4] / ".venv-interop" / "bin" / "python"
ROWS = [
    {"row_index": 0, "run_index": 0, "rollout_id": A, "trajectory_filename": "trajectory.json",
     "status": "success", "reward": 1.0, "tokens": 7, "duration_ms": 5.0},
    {"row_index": 1, "run_index": 0, "rollout_id": B, "status": "failed", "tokens": 3,
     "duration_ms": 2.0},  # failed with no error_type: the official runner allows it
    {"row_index": 2, "run_index": 0, "rollout_id": C, "status": "skipped", "duration_ms": 1.0},
]  # fmt: skip
RUN = {
    "name": "theirs",
    "started_at": "2026-12-01T00:00:00Z",
    "completed_at": "2026-12-01T00:00:02Z",
    "experiment_config": {"rollout": {"name": "r", "source_digest": "d"}, "entrypoint": "main.py",
                          "model_path": "openai/m",
                          "dataset": {"name": "ds", "sha256": "0" * 64,
                                      "selected_source_rows": "0-2"}},
    "evaluation_config": {"n": 1, "pass_threshold": 0.5},
}  # fmt: skip


def _uploaded(root: Path) -> Path:
    """What the official `eval upload` sends for ROWS."""
    root.mkdir()
    (root / "index.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (root / "progress.json").write_text('{"total_runs": 3, "sampled_rows": 3, '
                                        '"total_dataset_rows": 3}')  # fmt: skip
    trial = root / "rollout_trials" / A
    (trial / "artifacts" / "deep").mkdir(parents=True)
    (trial / "trajectory.json").write_text(json.dumps({"session_id": A, "steps": []}))
    (trial / "artifacts" / "deep" / "out.txt").write_text("an artifact")
    return root


def test_an_upload_converts_to_our_layout_with_metrics_computed_from_the_index(tmp_path):
    source = _uploaded(tmp_path / "sent")
    target = tmp_path / "run"
    official_layout.convert(source, target, run=RUN, local_run_id="f" * 32,
                            provenance={"sdk_version": "0.3.8"}, schema_versions={})  # fmt: skip
    assert verify_run_dir(target, expected_name="theirs") == []
    summary = json.loads((target / "metrics.json").read_text())["summary"]
    assert (summary["passed"], summary["failed"], summary["skipped"]) == (1, 1, 1)
    assert summary["pass_rate"] == 0.5 and summary["pass_threshold"] == 0.5
    journal = [json.loads(line) for line in (target / "events.jsonl").read_text().splitlines()]
    assert journal[1]["error_type"] == "rollout_failed"  # ours needs one for a failure
    assert (target / "trajectories" / "row_0_run_0.json").stat().st_ino == (
        source / "rollout_trials" / A / "trajectory.json"
    ).stat().st_ino  # linked, not copied
    assert (target / "artifacts" / "row_0_run_0" / "deep" / "out.txt").read_text() == (
        "an artifact"
    )


def test_only_the_official_upload_paths_are_accepted():
    accepted = [
        "index.jsonl",
        "progress.json",
        "logs.txt",
        f"rollout_trials/{A}/trajectory.json",
        f"rollout_trials/{A}/trajectory-2.json",
        f"rollout_trials/{A}/artifacts/x/y.bin",
    ]
    refused = [
        "metrics.json",
        "manifest.json",
        f"rollout_trials/{A}/notes.json",
        f"rollout_trials/{A}/artifacts/manifest.json",
        "rollout_trials/short/trajectory.json",
        f"rollout_trials/{A}/../../x",
        f"/rollout_trials/{A}/trajectory.json",
    ]
    assert [official_layout.is_official_path(p) for p in accepted] == [True] * len(accepted)
    assert [official_layout.is_official_path(p) for p in refused] == [False] * len(refused)


def test_the_official_selector_digests_as_ours_does():
    ours = _selection_digest(Selection(rows=(0, 1, 2, 3, 4, 9), total_rows=12, method="rows"))
    assert official_layout.selection_digest("0-4,9") == ours
    assert official_layout.selection_digest("0-4") != ours
    assert official_layout.selection_digest("2:abc") is None  # already ours: not a selector


def test_a_journal_line_of_ours_is_never_read_as_an_official_one():
    when = datetime(2026, 12, 1, tzinfo=UTC)
    theirs = json.dumps({**ROWS[0], "source_row_index": 7}).encode()
    record = official_layout.journal_record(theirs, finished_at=when)
    assert record is not None and record.source_row_index == 7 and record.reward == 1.0
    ours = json.dumps({**ROWS[0], "schema_version": 2, "source_row_index": 0,
                       "finished_at": when.isoformat()}).encode()  # fmt: skip
    assert official_layout.journal_record(ours, finished_at=when) is None
    assert official_layout.journal_record(b'{"row_index": 0}', finished_at=when) is None


def test_trajectories_get_atif_conformant_and_artifacts_are_linked_into_rollout_trials(tmp_path):
    run = tmp_path / "run"
    (run / "trajectories").mkdir(parents=True)
    document = {
        "session_id": A,
        "steps": [{"step_id": 1, "metrics": {"prompt_tokens": 3, "latency_ms": 1.5}}],
        "final_metrics": {"total_steps": 1, "total_policy_calls": 1},
    }
    trajectory = run / "trajectories" / "row_0_run_0.json"
    trajectory.write_text(json.dumps(document))
    kept = run / "artifacts" / "row_0_run_0"
    kept.mkdir(parents=True)
    (kept / "out.txt").write_text("redacted copy")
    raw = run / "rollout_trials" / A / "artifacts"
    raw.mkdir(parents=True)
    (raw / "out.txt").write_text("what the rollout wrote, secret and all")
    (raw / "extra.txt").write_text("left out of the kept copy")
    record = AttemptRecord(row_index=0, run_index=0, rollout_id=A, source_row_index=0,
                           status="success", reward=1.0, duration_ms=1.0,
                           trajectory_filename="trajectory.json",
                           finished_at=datetime.now(UTC))  # fmt: skip
    official_layout.mirror_trial(run, record, trajectory=trajectory, document=document,
                                 artifacts=kept)  # fmt: skip
    written = json.loads((run / "rollout_trials" / A / "trajectory.json").read_text())
    assert written["steps"][0]["metrics"] == {"prompt_tokens": 3, "extra": {"latency_ms": 1.5}}
    assert written["final_metrics"] == {"total_steps": 1, "extra": {"total_policy_calls": 1}}
    assert sorted(p.name for p in raw.iterdir()) == ["out.txt"]  # only what the run kept
    assert (raw / "out.txt").stat().st_ino == (kept / "out.txt").stat().st_ino


def test_a_trial_directory_the_rollout_made_a_link_is_never_written_through(tmp_path):
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (run / "rollout_trials").mkdir(parents=True)
    (run / "rollout_trials" / A).symlink_to(elsewhere)
    trajectory = run / "trajectory.json"
    trajectory.write_text("{}")
    record = AttemptRecord(row_index=0, run_index=0, rollout_id=A, source_row_index=0,
                           status="success", duration_ms=1.0,
                           trajectory_filename="trajectory.json",
                           finished_at=datetime.now(UTC))  # fmt: skip
    official_layout.mirror_trial(run, record, trajectory=trajectory, document={}, artifacts=None)
    assert list(elsewhere.iterdir()) == []


def test_the_engines_trajectory_is_atif_valid_as_written_and_mirrored_as_a_link(tmp_path):
    answer = {"role": "assistant", "content": "4"}
    rollout_side = build_trajectory(
        rollout_id=A,
        messages=[{"role": "user", "content": "2 + 2?"}, answer],
        calls=[PolicyCall(request_messages=[], response_message=answer, model="m",
                          prompt_tokens=3, completion_tokens=1, latency_ms=2.5)],
        agent_version="1.0",
        osmosis={},
    )  # fmt: skip
    bridge_call = SimpleNamespace(prompt_tokens=3, completion_tokens=1, cost_usd=0.01,
                                  latency_ms=2.5, model="m", status_code=200,
                                  response_message=answer)  # fmt: skip
    record = AttemptRecord(row_index=0, run_index=0, rollout_id=A, source_row_index=0,
                           status="success", reward=1.0, duration_ms=1.0, prompt_tokens=3,
                           completion_tokens=1, cost_usd=0.01,
                           trajectory_filename="trajectory.json",
                           finished_at=datetime.now(UTC))  # fmt: skip
    document = enrich_trajectory(rollout_side, [bridge_call], record)
    agent = document["steps"][1]
    assert agent["metrics"] == {"prompt_tokens": 3, "completion_tokens": 1, "cost_usd": 0.01,
                                "extra": {"latency_ms": 2.5}}  # fmt: skip
    assert document["final_metrics"]["extra"] == {"total_policy_calls": 1}
    assert official_layout.atif_conformant(document) is document
    # The official client's own ATIF model (extra="forbid") accepts it as written.
    checked = subprocess.run(
        [str(INTEROP_PYTHON), "-c", "import sys\n"
         "from osmosis_ai.rollout.trajectory.atif import Trajectory\n"
         "Trajectory.model_validate_json(sys.stdin.read())"],
        input=json.dumps(document), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stderr[-2000:]
    trajectory = tmp_path / "run" / "trajectories" / "row_0_run_0.json"
    trajectory.parent.mkdir(parents=True)
    trajectory.write_text(json.dumps(document))
    official_layout.mirror_trial(tmp_path / "run", record, trajectory=trajectory,
                                 document=document, artifacts=None)  # fmt: skip
    mirrored = tmp_path / "run" / "rollout_trials" / A / "trajectory.json"
    assert mirrored.stat().st_ino == trajectory.stat().st_ino
