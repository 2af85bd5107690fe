"""The example workspace runs in the suite, so it cannot rot."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_demo_serves_the_example_rollout_and_grades_every_row():
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py"), "--wrong-rate", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "passed 24/24 (100%)" in done.stdout


@pytest.mark.slow
def test_wrong_answers_from_the_model_are_graded_zero():
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py"), "--wrong-rate", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "passed 0/24 (0%)" in done.stdout
