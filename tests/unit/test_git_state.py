"""Which commit `eval submit` sends, and the warnings about code the platform will not see.

Real git repositories, each with a local bare repository as `origin`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from osmosis.git_state import GitStateError, begin_git_state, object_ids, resolve_git_state

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


def test_without_branch_or_sha_origins_default_branch_is_asked_of_origin(tree):
    # After `git remote add` + `git push` there is no refs/remotes/origin/HEAD in the clone.
    no_origin_head = subprocess.run(
        ["git", "symbolic-ref", "-q", "refs/remotes/origin/HEAD"], cwd=tree, env=GIT_ENV
    )
    assert no_origin_head.returncode != 0
    head = git(tree, "rev-parse", "HEAD")
    state = resolve_git_state(tree, branch=None, commit_sha=None)
    assert (state.commit_sha, state.branch, state.source) == (head, "main", "default_branch")
    assert state.pushed and state.unpushed_commits == 0 and not state.dirty_paths
    # Pushed, clean, on origin's default branch: nothing to warn about.
    assert state.warnings == []


def test_a_feature_branch_checked_out_does_not_replace_origins_default_branch(tree):
    main = git(tree, "rev-parse", "HEAD")
    git(tree, "checkout", "-q", "-b", "feature")
    commit(tree, "feature.txt")
    git(tree, "push", "-q", "-u", "origin", "feature")
    state = resolve_git_state(tree, branch=None, commit_sha=None)
    assert (state.commit_sha, state.branch, state.source) == (main, "main", "default_branch")


def test_origins_default_branch_need_not_be_named_like_any_local_branch(tree):
    # origin's HEAD is `trunk` (renamed on the server), at a commit this clone never fetched.
    origin = tree.parent / "origin.git"
    trunk_tip = commit(tree, "later.txt")
    git(tree, "push", "-q", "origin", "HEAD:trunk")
    git(origin, "symbolic-ref", "HEAD", "refs/heads/trunk")
    git(tree, "reset", "-q", "--hard", "HEAD~1")
    git(tree, "update-ref", "-d", "refs/remotes/origin/trunk")
    git(tree, "reflog", "expire", "--expire=now", "--all")
    git(tree, "gc", "-q", "--prune=now")
    state = resolve_git_state(tree, branch=None, commit_sha=None)
    assert (state.commit_sha, state.branch) == (trunk_tip, "trunk")
    assert any("has not fetched" in w and trunk_tip[:7] in w for w in state.warnings)


def test_an_unreachable_origin_falls_back_to_the_current_branch_and_says_why(tree):
    git(tree, "remote", "set-url", "origin", str(tree.parent / "gone.git"))
    state = resolve_git_state(tree, branch=None, commit_sha=None)
    assert (state.branch, state.source) == ("main", "current_branch")
    assert any(
        "could not ask origin for its default branch" in w and "current branch main" in w
        for w in state.warnings
    )


def test_the_last_known_origin_head_is_used_when_origin_cannot_be_asked(tree):
    main = git(tree, "rev-parse", "HEAD")
    git(tree, "remote", "set-head", "origin", "main")
    git(tree, "checkout", "-q", "-b", "feature")
    commit(tree, "feature.txt")
    git(tree, "remote", "set-url", "origin", str(tree.parent / "gone.git"))
    state = resolve_git_state(tree, branch=None, commit_sha=None)
    assert (state.commit_sha, state.branch, state.source) == (main, "main", "default_branch")
    assert any("the last known origin/HEAD" in w for w in state.warnings)


def test_a_branch_tracking_an_upstream_of_another_name_is_pushed_under_that_name(tree):
    git(tree, "checkout", "-q", "-b", "feature")
    tip = commit(tree, "feature.txt")
    git(tree, "push", "-q", "-u", "origin", "feature:feat-x")
    state = resolve_git_state(tree, branch="feature", commit_sha=None)
    assert (state.commit_sha, state.branch, state.pushed) == (tip, "feat-x", True)
    assert not any("has no upstream" in w for w in state.warnings)
    assert any("local branch feature tracks origin/feat-x" in w for w in state.warnings)

    commit(tree, "more.txt")
    state = resolve_git_state(tree, branch="feature", commit_sha=None)
    assert state.commit_sha == tip and state.unpushed_commits == 1
    assert any("(git push origin feature:feat-x)" in w for w in state.warnings)


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


def test_an_origin_whose_head_names_a_missing_branch_is_not_called_empty(tree):
    # `git init --bare` without -b main: HEAD names `master`, but `main` was pushed.
    git(tree.parent / "origin.git", "symbolic-ref", "HEAD", "refs/heads/master")
    state = resolve_git_state(tree, branch=None, commit_sha=None)
    assert (state.branch, state.source) == ("main", "current_branch")
    (warning,) = [w for w in state.warnings if "default branch" in w]
    assert "nothing pushed" not in warning
    assert "names a branch it does not have, though it has main" in warning
    assert "git symbolic-ref HEAD refs/heads/main" in warning


def test_an_origin_with_nothing_pushed_says_so(tmp_path):
    work = new_repo(tmp_path)
    commit(work, "README.md")
    state = resolve_git_state(work, branch=None, commit_sha=None)
    assert any("nothing pushed" in w for w in state.warnings)


def test_object_ids_answers_every_name_at_once_found_or_not(tree):
    head = git(tree, "rev-parse", "HEAD")
    readme = git(tree, "rev-parse", "HEAD:README.md")
    odd = commit(tree, "two\nlines.txt", "y")  # a name with a line break is asked alone
    blob = git(tree, "rev-parse", f"{odd}:two\nlines.txt")
    names = [f"{head}^{{commit}}", "HEAD:./README.md", "HEAD:./two\nlines.txt", "HEAD:./nope",
             "nope^{commit}", ""]  # fmt: skip
    assert object_ids(tree, names) == [head, readme, blob, None, None, None]
    assert object_ids(tree / "not-a-repository", ["HEAD^{commit}"]) == [None]


def test_a_git_state_left_unread_does_not_wait_for_origin(tree):
    # An error before `result()` (or Ctrl-C) ends the questions still running: here origin
    # takes 20 s to answer `ls-remote`, and its pid says which process to end afterwards.
    pid_file = tree.parent / "upload-pack.pid"
    git(tree, "config", "remote.origin.uploadpack", f"echo $$ > {pid_file}; exec sleep 20 #")
    pending = begin_git_state(tree, branch=None, commit_sha=None)
    try:
        deadline = time.monotonic() + 10
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pid_file.exists(), "ls-remote never reached origin"
        started = time.monotonic()
        pending.close()
        assert time.monotonic() - started < 5
    finally:
        pending.close()
        pid = pid_file.read_text().strip() if pid_file.exists() else ""
        if pid.isdigit() and int(pid) > 1:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
