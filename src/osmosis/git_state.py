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

`begin_git_state` starts the questions that need no earlier answer (is there a commit, the
config's branch or commit, origin's HEAD, the work tree's status) as processes and returns
at once; its `result()` reads them and asks the rest. `eval submit` imports its request
modules meanwhile (on a real `origin`, `ls-remote` is a network round trip):

    with begin_git_state(Path("."), branch=None, commit_sha=None) as pending:
        ...                                  # other work
        state = pending.result()

Standard library and the `git` executable only.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from osmosis.workspace import git_missing, run_git

__all__ = [
    "GitState",
    "GitStateError",
    "PendingGitState",
    "begin_git_state",
    "object_ids",
    "resolve_git_state",
]

REMOTE = "origin"
# The whole repository (even from a workspace in a subfolder of it), minus any `.osmosis/`.
_STATUS_PATHSPEC = (":(top)", ":(top,exclude,glob)**/.osmosis/**")
_DIRTY_SHOWN = 5  # paths named in the dirty-tree warning; the rest are counted
_LS_REMOTE_TIMEOUT_S = 20  # a submit waits this long for origin to name its default branch
_GIT_TIMEOUT_S = 30  # as `run_git`'s
# Object names written at once, at most: their answers stay far below a pipe's 64 KiB.
_EARLY_LINES, _EARLY_CHARS = 64, 4096


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


class _Started:
    """A git process started now and read later (`done`), or ended unread (`close`)."""

    def __init__(
        self,
        top: Path,
        *args: str,
        lines: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        timeout: float = _GIT_TIMEOUT_S,
    ) -> None:
        self._deadline = time.monotonic() + timeout
        try:
            self._process = subprocess.Popen(
                ["git", "-C", str(top), *args],
                stdin=subprocess.PIPE if lines else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
        except FileNotFoundError:
            raise git_missing() from None
        self._done: subprocess.CompletedProcess[str] | None = None
        self._input = "".join(f"{line}\n" for line in lines)
        # Written now, so that git answers while the caller works, when its answers cannot
        # fill the pipe before they are read (then git would stop reading); else by `done`.
        early = len(lines) <= _EARLY_LINES and len(self._input) <= _EARLY_CHARS
        if self._input and early and self._process.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self._process.stdin.write(self._input)
                self._process.stdin.flush()
            self._input = ""

    def done(self) -> subprocess.CompletedProcess[str]:
        """Its exit code and output once it ended; `subprocess.TimeoutExpired` (and the
        process killed) when that takes longer than its timeout from its start."""
        if self._done is None:
            try:
                out, err = self._process.communicate(
                    self._input or None, timeout=max(self._deadline - time.monotonic(), 0.0)
                )
            except subprocess.TimeoutExpired:
                self.close()
                raise
            self._done = subprocess.CompletedProcess(
                self._process.args, self._process.returncode, out, err
            )
        return self._done

    def close(self) -> None:
        """Kill it if it still runs and reap it, its output unread. Idempotent."""
        if self._done is None:
            self._process.kill()
            # Not read to the end: a child git left behind (ssh) may hold the pipes open.
            for stream in (self._process.stdin, self._process.stdout, self._process.stderr):
                if stream is not None:
                    with contextlib.suppress(BrokenPipeError):
                        stream.close()
            self._process.wait()
            self._done = subprocess.CompletedProcess(self._process.args, -9, "", "")


class _Objects:
    """`git cat-file --batch-check` asked about several object names at once (a process
    per name was ~3 ms each of a submit)."""

    def __init__(self, top: Path, names: Sequence[str]) -> None:
        self._top, self._names = top, list(names)
        # A name with a line break cannot go on a line of its own: it is asked alone.
        self._alone = [any(c in name for c in "\r\n") for name in self._names]
        lines = [
            "" if alone else name for name, alone in zip(self._names, self._alone, strict=True)
        ]
        self._started = _Started(top, "cat-file", "--batch-check=%(objectname)", lines=lines)

    def ids(self) -> list[str | None]:
        done = self._started.done()
        lines = done.stdout.splitlines() if done.returncode == 0 else []
        if len(lines) != len(self._names):  # git failed (not a repository): nothing is known
            lines = [" missing"] * len(self._names)
        # A name found answers its object id alone; one not found `<name> missing` (or
        # `ambiguous`).
        return [
            _out(self._top, "rev-parse", "--verify", "--quiet", name)
            if alone
            else (line if line and " " not in line else None)
            for name, alone, line in zip(self._names, self._alone, lines, strict=True)
        ]

    def close(self) -> None:
        self._started.close()


def object_ids(top: Path, names: Sequence[str]) -> list[str | None]:
    """The id of the object each of `names` names in the repository at `top`, None where it
    names none: one `git cat-file --batch-check` answers them all.

        object_ids(top, ["HEAD^{commit}", "HEAD:./README.md"])  # ['3f9a…', None]
    """
    asked = _Objects(top, names)
    try:
        return asked.ids()
    finally:
        asked.close()


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


def _ask_status(top: Path) -> _Started:
    # `.osmosis/` is the CLI's own output (run results, saved metrics, dataset cache): it
    # is never code the platform would miss, so it does not make the tree dirty.
    return _Started(
        top, "status", "--porcelain", "--untracked-files=normal", "--", *_STATUS_PATHSPEC
    )


def _dirty_paths(status: subprocess.CompletedProcess[str]) -> tuple[str, ...]:
    if status.returncode != 0:
        return ()
    return tuple(line[3:] for line in status.stdout.splitlines() if len(line) > 3)


@dataclass(frozen=True)
class _RemoteHead:
    """What `origin` says its HEAD is: the default branch and its commit; or why it could not."""

    branch: str | None = None
    sha: str | None = None
    problem: str | None = None


def _no_prompt() -> dict[str, str]:
    """The environment of a git command that reaches `origin`: it never asks for credentials."""
    return {**os.environ, "GIT_TERMINAL_PROMPT": "0"}


def _ask_origin_head(top: Path) -> _Started:
    """`git ls-remote --symref origin HEAD`, started now."""
    return _Started(
        top,
        "ls-remote",
        "--symref",
        REMOTE,
        "HEAD",
        env=_no_prompt(),
        timeout=_LS_REMOTE_TIMEOUT_S,
    )


def _origin_head(top: Path, asked: _Started) -> _RemoteHead:
    """What `_ask_origin_head` heard."""
    try:
        done = asked.done()
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
        return _RemoteHead(problem=_why_no_head(top, _no_prompt()))
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


def begin_git_state(top: Path, *, branch: str | None, commit_sha: str | None) -> PendingGitState:
    """Start resolving the commit a run submitted from the work tree at `top` will use (see
    the module doc); `result()` of what it returns gives it."""
    return PendingGitState(top, branch=branch, commit_sha=commit_sha)


def resolve_git_state(top: Path, *, branch: str | None, commit_sha: str | None) -> GitState:
    """The commit a run submitted from the work tree at `top` will use (see the module doc).

    Raises `GitStateError` when no commit can be named (an unknown sha or branch, or a
    repository with no commits).
    """
    with begin_git_state(top, branch=branch, commit_sha=commit_sha) as pending:
        return pending.result()


class PendingGitState:
    """The git state `begin_git_state` started to resolve: `result()` gives it (or raises
    `GitStateError`); `close()` (or leaving its `with` block) ends what still runs."""

    def __init__(self, top: Path, *, branch: str | None, commit_sha: str | None) -> None:
        self._top, self._branch, self._commit_sha = top, branch, commit_sha
        # What needs no earlier answer: HEAD and the config's refs in one batch, the status,
        # and origin's HEAD when it decides.
        if commit_sha is not None:
            refs = [f"{commit_sha}^{{commit}}"]
        elif branch is not None:
            refs = [f"refs/remotes/{REMOTE}/{branch}^{{commit}}", f"refs/heads/{branch}^{{commit}}"]
        else:
            refs = []
        with contextlib.ExitStack() as started:
            self._objects = _Objects(top, ["HEAD^{commit}", *refs])
            started.callback(self._objects.close)
            self._status = _ask_status(top)
            started.callback(self._status.close)
            self._origin = None if refs else _ask_origin_head(top)
            if self._origin is not None:
                started.callback(self._origin.close)
            self._running = started.pop_all()

    def result(self) -> GitState:
        top = self._top
        head, *refs = self._objects.ids()
        if head is None:
            raise GitStateError(
                f"the repository at {top} has no commits; the platform runs committed, pushed code",
                hint="git add rollouts configs && git commit -m 'first rollout' && git push",
            )
        warnings: list[str] = []
        if self._commit_sha is not None:
            state = _pinned(top, self._commit_sha, refs[0], warnings)
        elif self._branch is not None:
            state = _on_branch(top, self._branch, "branch", warnings, refs=(refs[0], refs[1]))
        else:
            assert self._origin is not None
            state = _on_default_branch(top, _origin_head(top, self._origin), warnings)
        dirty = _dirty_paths(self._status.done())
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

    def close(self) -> None:
        """End the git processes still running. Idempotent."""
        self._running.close()

    def __enter__(self) -> PendingGitState:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _pinned(top: Path, commit_sha: str, sha: str | None, warnings: list[str]) -> GitState:
    """`commit_sha` from the config, `sha` the commit it names here (None: none)."""
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


def _on_default_branch(top: Path, head: _RemoteHead, warnings: list[str]) -> GitState:
    """Neither branch nor commit_sha: `origin`'s default branch (`head`, what it said) at the
    commit it has now."""
    if head.branch is not None and head.sha is not None:
        local_sha, known_sha = object_ids(
            top, [f"refs/heads/{head.branch}^{{commit}}", f"{head.sha}^{{commit}}"]
        )
        known = known_sha is not None
        # A local branch where origin has it (the usual case) has nothing to count.
        counted = local_sha is not None and known and local_sha != head.sha
        ahead = _count(top, f"{head.sha}..{local_sha}") if counted else 0
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


def _on_branch(
    top: Path,
    branch: str | None,
    source: str,
    warnings: list[str],
    *,
    refs: tuple[str | None, str | None] | None = None,
) -> GitState:
    """`branch` as origin has it, else as it is here; `refs`, when already asked, the commits
    of `refs/remotes/origin/<branch>` and `refs/heads/<branch>`."""
    if branch is None:  # detached HEAD and no origin/HEAD: the commit checked out now
        sha = _commit_of(top, "HEAD") or ""
        pushed = _remote_has(top, sha)
        if not pushed:
            warnings.append(
                f"HEAD ({sha[:7]}) is detached and not on any branch of {REMOTE}: push it first"
            )
        return GitState(commit_sha=sha, branch=None, source=source, pushed=pushed)
    if refs is None:
        found = object_ids(
            top, [f"refs/remotes/{REMOTE}/{branch}^{{commit}}", f"refs/heads/{branch}^{{commit}}"]
        )
        refs = (found[0], found[1])
    remote_sha, local_sha = refs
    local = branch
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
    counted = local_sha is not None and local_sha != remote_sha
    ahead = _count(top, f"{remote_sha}..{local_sha}") if counted else 0
    if ahead:
        refspec = branch if local == branch else f"{local}:{branch}"
        warnings.append(
            f"{ahead} local commit(s) on {local} are not pushed; the platform runs "
            f"{REMOTE}/{branch} at {remote_sha[:7]} (git push {REMOTE} {refspec})"
        )
    return GitState(commit_sha=remote_sha, branch=branch, source=source, unpushed_commits=ahead)
