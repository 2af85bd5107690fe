"""What a rollout leaves on disk under `_OSMOSIS_ROLLOUT_ARTIFACT_ROOT` (§3.12)."""

from __future__ import annotations

import json

from .apps.behaviours import ARTIFACT_FILES
from .harness import DEFAULT_PROMPT, RolloutServer, meta


def test_trajectory_is_an_atif_document_beside_the_rollouts_artifacts(
    main: RolloutServer,
) -> None:
    metadata = meta()
    extra_fields = {"row_index": 3, "run_index": 1}
    handle = main.submit(metadata, label="4", extra_fields=extra_fields)

    result = main.wait_terminal(handle)

    assert result["status"] == "success"
    # Request extra_fields go to the trajectory, not into the wire sample.
    assert result["sample"]["extra_fields"] == {}
    # The document is written before the result turns terminal.
    path = main.rollout_dir(handle.rollout_id) / "trajectory.json"
    document = json.loads(path.read_text(encoding="utf-8"))
    assert document["schema_version"] == "ATIF-v1.7"
    assert document["session_id"] == handle.rollout_id
    assert isinstance(document["agent"]["name"], str)
    assert document["agent"]["name"]
    assert isinstance(document["agent"]["version"], str)
    steps = document["steps"]
    assert [step["source"] for step in steps] == ["system", "user", "agent"]
    assert [step["message"] for step in steps] == [
        DEFAULT_PROMPT[0]["content"],
        DEFAULT_PROMPT[1]["content"],
        "4",
    ]
    assert [step["step_id"] for step in steps] == [1, 2, 3]
    assert document["final_metrics"]["total_steps"] == 3
    osmosis = document["extra"]["osmosis"]
    assert osmosis["rollout_id"] == handle.rollout_id
    assert osmosis["label"] == "4"
    assert osmosis["reward"] == 1.0
    assert osmosis["sample_metrics"] == {"turns": 1.0}
    assert osmosis["request_metadata"] == metadata
    assert osmosis["request_extra_fields"] == extra_fields


def test_files_written_to_artifacts_dir_land_under_the_rollout_id(main: RolloutServer) -> None:
    handle = main.submit(meta(behaviour="artifact"))

    assert main.wait_terminal(handle)["status"] == "success"

    artifacts = main.rollout_dir(handle.rollout_id) / "artifacts"
    for relative, text in ARTIFACT_FILES.items():
        assert (artifacts / relative).read_text(encoding="utf-8") == text
