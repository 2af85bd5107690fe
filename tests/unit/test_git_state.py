"""Which commit `eval submit` sends, and the warnings about code the platform will not see.

Real git repositories, each with a local bare repository as `origin`.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from osmosis.git_state import GitStateError, resolve_git_state

GIT_ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "Ada",
    "GIT_AUTHOR_EMAIL": "ada@example.com",
    "GIT_COMMITTER_NAME": "Ada",
    "GIT_COMMITTER_EMAIL": "ada@example.com",
    "GIT_CONFIG_GLOBAL": os.devnull,
}


def git(cwd: Path, *args: str) -> str:
    result = subprocess.run(
        ["git", *args], cwd=cwd, env=GIT_ENV, capture_output=True, text=True, check=True
    )
    return result.stdout.strip()


def commit(tree: Path, name: str, text: str = "x") -> str:
    (tree / name).write_text(text)
    git(tree, "add", name)
    git(tree, "commit", "-q", "-m", f"add {name}")
    return git(tree, "rev-parse", "HEAD")


def new_repo(root: Path) -> Path:
    """An empty work tree on `main` whose `origin` is a new bare repository beside it."""
    remote = root / "origin.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(remote)], check=True)
    work = root / "work"
    work.mkdir()
    git(work, "init", "-q", "-b", "main")
    git(work, "remote", "add", "origin", str(remote))
    return work


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A work tree on `main` with one commit pushed to a bare `origin`."""
    work = new_repo(tmp_path)
    commit(work, "README.md")
    git(work, "push", "-q", "-u", "origin", "main")
    return work


def test_without_branch_or_sha_the_tip_of_the_pushed_current_branch_is_used(tree):
    head = git(tree, "rev-parse", "HEAD")
    state = resolve_git_state(tree, branch=None, commit_sha=None)
    assert (state.commit_sha, state.branch, state.source) == (head, "main", "current_branch")
    assert state.pushed and state.unpushed_commits == 0 and not state.dirty_paths
    # The only notice: the run is not pinned.
    assert len(state.warnings) == 1 and "no commit_sha set" in state.warnings[0]


def test_origin_head_names_the_default_branch_even_from_another_branch(tree):
    main = git(tree, "rev-parse", "HEAD")
    git(tree, "remote", "set-head", "origin", "main")
    git(tree, "checkout", "-q", "-b", "feature")
    commit(tree, "feature.txt")
    state = resolve_git_state(tree, branch=None, commit_sha=None)
    assert (state.commit_sha, state.branch, state.source) == (main, "main", "default_branch")


def test_unpushed_commits_are_counted_and_the_pushed_tip_is_used(tree):
    pushed = git(tree, "rev-parse", "HEAD")
    commit(tree, "a.txt")
    commit(tree, "b.txt")
    state = resolve_git_state(tree, branch="main", commit_sha=None)
    assert state.commit_sha == pushed and state.unpushed_commits == 2
    assert any("2 local commit(s) on main are not pushed" in w for w in state.warnings)


def test_a_branch_that_was_never_pushed_is_used_locally_with_a_no_upstream_warning(tree):
    git(tree, "checkout", "-q", "-b", "local-only")
    tip = commit(tree, "local.txt")
    state = resolve_git_state(tree, branch="local-only", commit_sha=None)
    assert (state.commit_sha, state.branch, state.pushed) == (tip, "local-only", False)
    assert any(
        "has no upstream" in w and "git push -u origin local-only" in w for w in state.warnings
    )


def test_a_dirty_tree_is_reported_with_its_paths(tree):
    (tree / "README.md").write_text("changed")
    (tree / "new.py").write_text("print()")
    state = resolve_git_state(tree, branch=None, commit_sha=None)
    assert set(state.dirty_paths) == {"README.md", "new.py"}
    assert "uncommitted changes (README.md, new.py)" in state.warnings[0]


def test_the_clis_own_osmosis_folder_does_not_make_the_tree_dirty(tree):
    # `eval info` saves metrics.json under .osmosis/evals/; submitting next must not warn.
    saved = tree / ".osmosis" / "evals" / "run-1" / "metrics.json"
    saved.parent.mkdir(parents=True)
    saved.write_text("{}")
    (tree / "sub" / ".osmosis").mkdir(parents=True)
    (tree / "sub" / ".osmosis" / "x").write_text("")
    state = resolve_git_state(tree, branch=None, commit_sha=None)
    assert state.dirty_paths == ()
    assert not any("uncommitted" in warning for warning in state.warnings)


def test_a_short_commit_sha_expands_to_40_hex_and_is_checked_against_origin(tree):
    pushed = git(tree, "rev-parse", "HEAD")
    state = resolve_git_state(tree, branch=None, commit_sha=pushed[:7])
    assert (state.commit_sha, state.branch, state.source) == (pushed, None, "commit_sha")
    assert state.warnings == []

    local = commit(tree, "later.txt")
    state = resolve_git_state(tree, branch=None, commit_sha=local[:10])
    assert state.commit_sha == local and not state.pushed
    assert any(f"commit {local[:7]} is not on any branch of origin" in w for w in state.warnings)


@pytest.mark.parametrize(
    ("branch", "sha", "message"),
    [
        (None, "deadbee", "experiment.commit_sha deadbee is not a commit in this repository"),
        ("nope", None, "branch 'nope' exists neither locally nor on origin"),
    ],
)
def test_an_unknown_commit_or_branch_is_an_error_that_names_it(tree, branch, sha, message):
    with pytest.raises(GitStateError) as caught:
        resolve_git_state(tree, branch=branch, commit_sha=sha)
    assert message in caught.value.message and caught.value.hint


def test_a_repository_without_commits_cannot_be_submitted(tmp_path):
    git(tmp_path, "init", "-q", "-b", "main")
    with pytest.raises(GitStateError, match="has no commits"):
        resolve_git_state(tmp_path, branch=None, commit_sha=None)
