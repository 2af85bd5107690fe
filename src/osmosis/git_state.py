"""What the platform will check out when a config is submitted, and what it will not see.

The platform clones the workspace's `origin` and runs a pushed commit; config values come from
the local file, code from git. So `eval submit` resolves one commit and warns about everything
local the platform cannot see (uncommitted changes, commits not pushed, a branch with no
upstream):

    state = resolve_git_state(Path("."), branch=None, commit_sha=None)
    state.commit_sha, state.branch, state.warnings  # ('3f9a…', 'main', [...])

Which commit, first rule that applies:

1. `commit_sha` from the config: must name a commit in the local repository; expanded to 40 hex.
2. `branch` from the config: the branch as `origin` has it (`refs/remotes/origin/<branch>`),
   else the local branch of that name (with a warning: it is not pushed).
3. neither: the remote's default branch (`origin/HEAD`), else the current branch.

Standard library and the `git` executable only.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from osmosis.workspace import _git

__all__ = ["GitState", "GitStateError", "resolve_git_state"]

REMOTE = "origin"
# The whole repository (even from a workspace in a subfolder of it), minus any `.osmosis/`.
_STATUS_PATHSPEC = (":(top)", ":(top,exclude,glob)**/.osmosis/**")
_DIRTY_SHOWN = 5  # paths named in the dirty-tree warning; the rest are counted


class GitStateError(Exception):
    """The commit to submit cannot be determined; `hint` says how to fix it."""

    def __init__(self, message: str, *, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


@dataclass(frozen=True)
class GitState:
    """The commit a submitted run will check out, and what the user should know about it.

    `source` says how the commit was chosen: `commit_sha`, `branch`, `default_branch` or
    `current_branch`. `branch` is None when a commit was pinned or HEAD is detached.
    """

    commit_sha: str
    branch: str | None
    source: str
    dirty_paths: tuple[str, ...] = ()
    unpushed_commits: int = 0
    pushed: bool = True
    warnings: list[str] = field(default_factory=list)


def _run(top: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _git(*args, cwd=top)


def _out(top: Path, *args: str) -> str | None:
    result = _run(top, *args)
    return result.stdout.strip() if result.returncode == 0 and result.stdout.strip() else None


def _commit_of(top: Path, ref: str) -> str | None:
    """The full sha of the commit `ref` names, or None."""
    return _out(top, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")


def _remote_has(top: Path, sha: str) -> bool:
    """True when some branch of `origin` (as last fetched or pushed) contains `sha`."""
    found = _out(top, "branch", "-r", "--contains", sha, "--list", f"{REMOTE}/*")
    return found is not None


def _count(top: Path, revisions: str) -> int:
    text = _out(top, "rev-list", "--count", revisions)
    return int(text) if text and text.isdigit() else 0


def _dirty_paths(top: Path) -> tuple[str, ...]:
    # `.osmosis/` is the CLI's own output (run results, saved metrics, dataset cache): it
    # is never code the platform would miss, so it does not make the tree dirty.
    result = _run(top, "status", "--porcelain", "--untracked-files=normal", "--", *_STATUS_PATHSPEC)
    if result.returncode != 0:
        return ()
    return tuple(line[3:] for line in result.stdout.splitlines() if len(line) > 3)


def _default_branch(top: Path) -> tuple[str | None, str]:
    """(branch, source): `origin/HEAD`'s target, else the current branch (None if detached)."""
    head = _out(top, "symbolic-ref", "--quiet", "--short", f"refs/remotes/{REMOTE}/HEAD")
    if head and head.startswith(f"{REMOTE}/"):
        return head[len(REMOTE) + 1 :], "default_branch"
    return _out(top, "symbolic-ref", "--quiet", "--short", "HEAD"), "current_branch"


def resolve_git_state(top: Path, *, branch: str | None, commit_sha: str | None) -> GitState:
    """The commit a run submitted from the work tree at `top` will use (see the module doc).

    Raises `GitStateError` when no commit can be named (an unknown sha or branch, or a
    repository with no commits).
    """
    if _commit_of(top, "HEAD") is None:
        raise GitStateError(
            f"the repository at {top} has no commits; the platform runs committed, pushed code",
            hint="git add rollouts configs && git commit -m 'first rollout' && git push",
        )
    warnings: list[str] = []
    if commit_sha is not None:
        state = _pinned(top, commit_sha, warnings)
    else:
        source = "branch"
        if branch is None:
            branch, source = _default_branch(top)
        state = _on_branch(top, branch, source, warnings)
    dirty = _dirty_paths(top)
    if dirty:
        shown = ", ".join(dirty[:_DIRTY_SHOWN])
        more = f" and {len(dirty) - _DIRTY_SHOWN} more" if len(dirty) > _DIRTY_SHOWN else ""
        warnings.insert(
            0,
            f"the work tree has uncommitted changes ({shown}{more}); the platform runs the "
            "committed code only",
        )
    if commit_sha is None:
        warnings.append(
            f"no commit_sha set: the run uses {state.commit_sha[:7]}, the tip of "
            f"{state.branch or 'HEAD'} now; set experiment.commit_sha to pin a reproducible run"
        )
    return GitState(
        commit_sha=state.commit_sha,
        branch=state.branch,
        source=state.source,
        dirty_paths=dirty,
        unpushed_commits=state.unpushed_commits,
        pushed=state.pushed,
        warnings=warnings,
    )


def _pinned(top: Path, commit_sha: str, warnings: list[str]) -> GitState:
    sha = _commit_of(top, commit_sha)
    if sha is None:
        raise GitStateError(
            f"experiment.commit_sha {commit_sha} is not a commit in this repository (unknown, "
            "or an ambiguous prefix)",
            hint=f"git fetch {REMOTE}, or use a longer prefix, or fix the config",
        )
    pushed = _remote_has(top, sha)
    if not pushed:
        warnings.append(
            f"commit {sha[:7]} is not on any branch of {REMOTE}: push it before the platform "
            "can check it out"
        )
    return GitState(commit_sha=sha, branch=None, source="commit_sha", pushed=pushed)


def _on_branch(top: Path, branch: str | None, source: str, warnings: list[str]) -> GitState:
    if branch is None:  # detached HEAD and no origin/HEAD: the commit checked out now
        sha = _commit_of(top, "HEAD") or ""
        pushed = _remote_has(top, sha)
        if not pushed:
            warnings.append(
                f"HEAD ({sha[:7]}) is detached and not on any branch of {REMOTE}: push it first"
            )
        return GitState(commit_sha=sha, branch=None, source=source, pushed=pushed)
    remote_sha = _commit_of(top, f"refs/remotes/{REMOTE}/{branch}")
    local_sha = _commit_of(top, f"refs/heads/{branch}")
    if remote_sha is None and local_sha is None:
        raise GitStateError(
            f"branch {branch!r} exists neither locally nor on {REMOTE}",
            hint=f"git fetch {REMOTE}, or fix experiment.branch",
        )
    if remote_sha is None:
        warnings.append(
            f"branch {branch} has no upstream on {REMOTE}: the platform cannot check it out "
            f"until you push it (git push -u {REMOTE} {branch})"
        )
        return GitState(commit_sha=local_sha or "", branch=branch, source=source, pushed=False)
    ahead = _count(top, f"{remote_sha}..{local_sha}") if local_sha else 0
    if ahead:
        warnings.append(
            f"{ahead} local commit(s) on {branch} are not pushed; the platform runs "
            f"{REMOTE}/{branch} at {remote_sha[:7]} (git push {REMOTE} {branch})"
        )
    return GitState(commit_sha=remote_sha, branch=branch, source=source, unpushed_commits=ahead)
