"""What the platform will check out when a config is submitted, and what it will not see.

The platform clones the workspace's `origin` and runs a pushed commit; config values come from
the local file, code from git. So `eval submit` resolves one commit and warns about everything
local the platform cannot see (uncommitted changes, commits not pushed, a branch with no
upstream); a warning appears only when one applies:

    state = resolve_git_state(Path("."), branch=None, commit_sha=None)
    state.commit_sha, state.branch, state.warnings  # ('3f9a…', 'main', [...])

Which commit, first rule that applies:

1. `commit_sha` from the config: must name a commit in the local repository; expanded to 40 hex.
2. `branch` from the config: the branch as `origin` has it (`refs/remotes/origin/<branch>`);
   else, when the local branch tracks an upstream of another name on `origin`, that upstream
   (it is what the platform can check out); else the local branch (with a warning: it is not
   pushed).
3. neither: `origin`'s default branch, asked of `origin` itself at submit time
   (`git ls-remote --symref origin HEAD`: after `git remote add` + `git push` a clone has no
   `refs/remotes/origin/HEAD`), at the commit `origin` has now. When `origin` cannot be
   asked, the last known `origin/HEAD`, else the current branch, with a warning.

Standard library and the `git` executable only.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from osmosis.workspace import run_git

__all__ = ["GitState", "GitStateError", "resolve_git_state"]

REMOTE = "origin"
# The whole repository (even from a workspace in a subfolder of it), minus any `.osmosis/`.
_STATUS_PATHSPEC = (":(top)", ":(top,exclude,glob)**/.osmosis/**")
_DIRTY_SHOWN = 5  # paths named in the dirty-tree warning; the rest are counted
_LS_REMOTE_TIMEOUT_S = 20  # a submit waits this long for origin to name its default branch


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
    return run_git(*args, cwd=top)


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


@dataclass(frozen=True)
class _RemoteHead:
    """What `origin` says its HEAD is: the default branch and its commit; or why it could not."""

    branch: str | None = None
    sha: str | None = None
    problem: str | None = None


def _ask_origin_head(top: Path) -> _RemoteHead:
    """`git ls-remote --symref origin HEAD`, never prompting for credentials."""
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    try:
        done = subprocess.run(
            ["git", "-C", str(top), "ls-remote", "--symref", REMOTE, "HEAD"],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            env=env,
            timeout=_LS_REMOTE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return _RemoteHead(problem=f"no answer within {_LS_REMOTE_TIMEOUT_S}s")
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return _RemoteHead(problem=lines[-1] if lines else f"exit code {done.returncode}")
    branch = sha = None
    for line in done.stdout.splitlines():
        left, _, name = line.partition("\t")
        if name != "HEAD":
            continue
        if left.startswith("ref: refs/heads/"):
            branch = left[len("ref: refs/heads/") :]
        elif len(left) == 40:
            sha = left
    if branch is None or sha is None:
        return _RemoteHead(problem=_why_no_head(top, env))
    return _RemoteHead(branch=branch, sha=sha)


def _why_no_head(top: Path, env: dict[str, str]) -> str:
    """Why `origin` names no default branch: nothing pushed, or a HEAD naming a branch it
    lacks (a bare repository made without `-b main`, then `main` pushed)."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        done = subprocess.run(
            ["git", "-C", str(top), "ls-remote", "--heads", REMOTE],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            env=env,
            timeout=_LS_REMOTE_TIMEOUT_S,
            check=False,
        )
        heads = [
            line.partition("\t")[2].removeprefix("refs/heads/")
            for line in done.stdout.splitlines()
            if done.returncode == 0 and "\trefs/heads/" in line
        ]
        if heads:
            shown = ", ".join(heads[:5])
            return (
                f"its HEAD names a branch it does not have, though it has {shown}; set it on "
                f"the origin with `git symbolic-ref HEAD refs/heads/{heads[0]}`"
            )
    return "it has no default branch yet (nothing pushed)"


def _upstream_on_origin(top: Path, branch: str) -> str | None:
    """The name on `origin` of the branch local `branch` tracks, when it tracks one there."""
    upstream = _out(top, "rev-parse", "--abbrev-ref", f"{branch}@{{upstream}}")
    if upstream and upstream.startswith(f"{REMOTE}/"):
        return upstream[len(REMOTE) + 1 :]
    return None


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
    elif branch is not None:
        state = _on_branch(top, branch, "branch", warnings)
    else:
        state = _on_default_branch(top, warnings)
    dirty = _dirty_paths(top)
    if dirty:
        shown = ", ".join(dirty[:_DIRTY_SHOWN])
        more = f" and {len(dirty) - _DIRTY_SHOWN} more" if len(dirty) > _DIRTY_SHOWN else ""
        warnings.insert(
            0,
            f"the work tree has uncommitted changes ({shown}{more}); the platform runs the "
            "committed code only",
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


def _on_default_branch(top: Path, warnings: list[str]) -> GitState:
    """Neither branch nor commit_sha: `origin`'s default branch at the commit it has now."""
    head = _ask_origin_head(top)
    if head.branch is not None and head.sha is not None:
        local_sha = _commit_of(top, f"refs/heads/{head.branch}")
        known = _commit_of(top, head.sha) is not None
        ahead = _count(top, f"{head.sha}..{local_sha}") if local_sha and known else 0
        if ahead:
            warnings.append(
                f"{ahead} local commit(s) on {head.branch} are not pushed; the platform runs "
                f"{REMOTE}/{head.branch} at {head.sha[:7]} (git push {REMOTE} {head.branch})"
            )
        elif not known:
            warnings.append(
                f"{REMOTE}'s default branch {head.branch} is at {head.sha[:7]}, which this "
                f"clone has not fetched: the run uses that commit (git fetch {REMOTE} to see it)"
            )
        return GitState(
            commit_sha=head.sha,
            branch=head.branch,
            source="default_branch",
            unpushed_commits=ahead,
        )
    # `origin` cannot be asked: what this clone last knew of it, else the current branch.
    known_head = _out(top, "symbolic-ref", "--quiet", "--short", f"refs/remotes/{REMOTE}/HEAD")
    branch: str | None
    if known_head and known_head.startswith(f"{REMOTE}/"):
        branch, source = known_head[len(REMOTE) + 1 :], "default_branch"
        using = f"{branch}, the last known {REMOTE}/HEAD"
    else:
        branch = _out(top, "symbolic-ref", "--quiet", "--short", "HEAD")
        source = "current_branch"
        using = f"the current branch {branch}" if branch else "the detached HEAD"
    warnings.append(
        f"could not ask {REMOTE} for its default branch ({head.problem}); using {using}; "
        "set experiment.branch to choose"
    )
    return _on_branch(top, branch, source, warnings)


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
    local, local_sha = branch, _commit_of(top, f"refs/heads/{branch}")
    upstream = _upstream_on_origin(top, branch) if remote_sha is None else None
    if upstream is not None and upstream != branch:
        upstream_sha = _commit_of(top, f"refs/remotes/{REMOTE}/{upstream}")
        if upstream_sha is not None:
            # `git push -u origin feature:feat-x`: origin knows it as feat-x, and that is the
            # name the platform can check out.
            warnings.append(
                f"local branch {branch} tracks {REMOTE}/{upstream}: the run uses {upstream}"
            )
            branch, remote_sha = upstream, upstream_sha
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
        refspec = branch if local == branch else f"{local}:{branch}"
        warnings.append(
            f"{ahead} local commit(s) on {local} are not pushed; the platform runs "
            f"{REMOTE}/{branch} at {remote_sha[:7]} (git push {REMOTE} {refspec})"
        )
    return GitState(commit_sha=remote_sha, branch=branch, source=source, unpushed_commits=ahead)
