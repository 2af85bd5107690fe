"""A run's checkout leaves its paths at once at the run's end (a rename, issue 30) and is deleted
after the run's status is written; what a worker killed in between left is swept. Real git
repositories and a bare origin on disk."""

from __future__ import annotations

from pathlib import Path

from osmosis.platform.worker.checkout import (
    RepoLimits,
    checkout_path,
    delete_set_aside,
    inputs_path,
    remove_checkout,
    remove_set_aside,
    set_aside_checkout,
)
from tests.platform import test_repo_limits
from tests.platform.test_repo_limits import origin_with


def check_out(home: Path, origin: str, commit: str) -> Path:
    tree = test_repo_limits.check_out(home, origin, commit, RepoLimits(max_bytes=0, max_files=0))
    inputs = inputs_path(home, "run1")
    inputs.mkdir(parents=True, exist_ok=True)
    (inputs / "bench.jsonl").write_text('{"user_prompt": "hi"}\n')
    return tree


def test_a_set_aside_checkout_frees_its_paths_for_a_retry_before_it_is_deleted(tmp_path):
    origin, commit = origin_with(tmp_path / "src", {"rollouts/r/main.py": b"print(1)\n"})
    home = tmp_path / "home"
    tree = check_out(home, origin, commit)
    aside = set_aside_checkout(home, "run1")
    assert not tree.exists() and not inputs_path(home, "run1").exists()
    assert len(aside) == 2 and all(path.is_dir() for path in aside)
    # A retry at once checks out afresh into the run's own path, the old copy still aside.
    again = check_out(home, origin, commit)
    assert (again / "rollouts" / "r" / "main.py").read_bytes() == b"print(1)\n"
    delete_set_aside(aside)
    assert not any(path.exists() for path in aside)
    assert again.is_dir() and inputs_path(home, "run1").is_dir()  # the retry's, untouched
    remove_checkout(home, "run1")
    assert sorted(p.name for p in (home / "checkouts").iterdir()) == []


def test_what_a_killed_worker_set_aside_is_swept_and_nothing_else(tmp_path):
    origin, commit = origin_with(tmp_path / "src", {"main.py": b"x = 1\n"})
    home = tmp_path / "home"
    check_out(home, origin, commit)
    left = set_aside_checkout(home, "run1")  # the worker dies before deleting these
    kept = check_out(home, origin, commit)  # a running run's checkout
    assert remove_set_aside(home) == 2
    assert not any(path.exists() for path in left)
    assert kept.is_dir() and kept == checkout_path(home, "run1")
    assert remove_set_aside(home) == 0
    assert remove_set_aside(tmp_path / "no-home") == 0
