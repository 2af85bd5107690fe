"""`OSMOSIS_NO_SKIPS=1` (set by `.ci/run`): a skipped test fails the run, with its reason."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUITE = """
import pytest

def test_skips_itself():
    pytest.skip("no widget on this machine")

@pytest.mark.skipif(True, reason="never here")
def test_marked_to_skip():
    pass

@pytest.mark.xfail(reason="a known bug")
def test_known_to_fail():
    assert False

def test_passes():
    pass
"""


def run_suite(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_suite.py").write_text(SUITE)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:randomly",
         "-p", "no:cacheprovider", "-q", str(tmp_path / "test_suite.py")],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "OSMOSIS_NO_SKIPS": "", **env},
    )  # fmt: skip


def test_skips_fail_under_osmosis_no_skips_and_name_their_reason(tmp_path):
    done = run_suite(tmp_path, OSMOSIS_NO_SKIPS="1")
    assert done.returncode == 1, done.stdout
    assert "1 failed, 1 passed, 1 xfailed, 1 error" in done.stdout
    assert "forbids skips: Skipped: no widget on this machine" in done.stdout
    assert "forbids skips: Skipped: never here" in done.stdout


def test_without_it_a_skip_is_a_skip(tmp_path):
    done = run_suite(tmp_path)
    assert done.returncode == 0, done.stdout
    assert "1 passed, 2 skipped, 1 xfailed" in done.stdout
