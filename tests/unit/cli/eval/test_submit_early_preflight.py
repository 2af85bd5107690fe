"""`eval submit` starts the entrypoint's pre-flight import from the config's raw TOML, before
its other imports and checks (issue 30: submit → first attempt recorded), and only for an
entrypoint file inside a rollout directory of the workspace: a config pointing elsewhere
runs nothing early. Real child interpreters; the entrypoints leave a mark when imported."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from osmosis.cli.eval.preflight import early_preflight

MARKING = "from pathlib import Path\nPath({mark!r}).write_text('imported')\n"


def workspace(root: Path, *, rollout: str, entrypoint: str) -> Path:
    """A workspace whose `rollouts/bench/main.py` and `outside.py` both mark `root/*.mark`."""
    (root / "rollouts" / "bench").mkdir(parents=True)
    (root / "configs" / "eval").mkdir(parents=True)
    for path in (root / "rollouts" / "bench" / "main.py", root / "outside.py"):
        path.write_text(MARKING.format(mark=str(root / f"{path.stem}.mark")))
    config = root / "configs" / "eval" / "smoke.toml"
    config.write_text(f'[experiment]\nrollout = "{rollout}"\nentrypoint = "{entrypoint}"\n')
    return config


def test_the_entrypoint_is_imported_from_the_raw_config(tmp_path: Path) -> None:
    config = workspace(tmp_path, rollout="bench", entrypoint="main.py")
    preflight = early_preflight(config, tmp_path)
    assert preflight is not None
    try:
        assert preflight.result() is None  # imported cleanly
    finally:
        preflight.close()
    assert (tmp_path / "main.mark").read_text() == "imported"
    assert (preflight.entrypoint, preflight.rollout_dir) == (
        tmp_path / "rollouts" / "bench" / "main.py",
        tmp_path / "rollouts" / "bench",
    )


@pytest.mark.parametrize(
    ("rollout", "entrypoint"),
    [
        ("bench", "../../outside.py"),  # out of the rollout's directory
        ("..", "outside.py"),  # a rollout that is not under rollouts/
        ("bench", "missing.py"),  # nothing to import
        ("bench", ""),  # the checked config says what is wrong
    ],
)
def test_nothing_runs_early_for_an_entrypoint_outside_its_rollout(
    tmp_path: Path, rollout: str, entrypoint: str
) -> None:
    config = workspace(tmp_path, rollout=rollout, entrypoint=entrypoint)
    assert early_preflight(config, tmp_path) is None
    assert not list(tmp_path.glob("*.mark"))


def test_a_config_that_is_not_toml_starts_nothing(tmp_path: Path) -> None:
    config = workspace(tmp_path, rollout="bench", entrypoint="main.py")
    config.write_text("[experiment\n")
    assert early_preflight(config, tmp_path) is None
    assert not list(tmp_path.glob("*.mark"))


def test_the_answer_does_not_wait_for_threads_the_import_left_running(tmp_path: Path) -> None:
    # A watcher or keep-alive thread the entrypoint starts would hold an interpreter's exit
    # until it ends; the submit needs only the import's outcome.
    config = workspace(tmp_path, rollout="bench", entrypoint="main.py")
    (tmp_path / "rollouts" / "bench" / "main.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(30,)).start()\n"
    )
    preflight = early_preflight(config, tmp_path)
    assert preflight is not None
    started = time.monotonic()
    try:
        assert preflight.result() is None
    finally:
        preflight.close()
    assert time.monotonic() - started < 20
