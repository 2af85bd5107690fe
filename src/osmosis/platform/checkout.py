"""A run's code: the submitted commit of the workspace's `origin`, checked out for one run.

    path = checkout(home, workspace_id="ab12…", origin_url="file:///srv/ws.git",
                    commit_sha="3f2c…", run_id="9e1d…", log=print)

A bare mirror of each origin is cached per workspace under `<home>/git/` and fetched only when
it lacks the commit; each run then gets its own clone at that commit under
`<home>/checkouts/<run_id>`, sharing the mirror's objects. Local paths and `file://` origins
work like any other URL. Failures raise `CheckoutError` with git's own last words.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

from osmosis.workspace import redact_url

_GIT_TIMEOUT_SEC = 600.0
_TAIL_LINES = 5
# Never prompt (there is no terminal), never run a hook or a credential helper of the mirror.
_GIT_ENV = {"GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true", "SSH_ASKPASS": "true"}
_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")  # a token in a URL that git quotes back


class CheckoutError(Exception):
    """The commit could not be checked out; the message says which step failed and why."""


def mirror_path(home: Path, *, workspace_id: str, origin_url: str) -> Path:
    digest = hashlib.sha256(origin_url.encode()).hexdigest()[:16]
    return home / "git" / workspace_id / f"{digest}.git"


def checkout_path(home: Path, run_id: str) -> Path:
    return home / "checkouts" / run_id


def checkout(
    home: Path,
    *,
    workspace_id: str,
    origin_url: str,
    commit_sha: str,
    run_id: str,
    log: Callable[[str], None],
) -> Path:
    """A working tree of `origin_url` at `commit_sha` for run `run_id`; reused when present."""
    target = checkout_path(home, run_id)
    if _head(target) == commit_sha:
        log(f"reusing the checkout of {commit_sha[:12]}")
        return target
    mirror = mirror_path(home, workspace_id=workspace_id, origin_url=origin_url)
    origin = redact_url(origin_url)
    with _locked(mirror.with_suffix(".lock")):
        if not (mirror / "HEAD").is_file():
            log(f"cloning {origin}")
            shutil.rmtree(mirror, ignore_errors=True)
            mirror.parent.mkdir(parents=True, exist_ok=True)
            _git(["clone", "--mirror", "--quiet", origin_url, str(mirror)], step="clone")
        if not _has_commit(mirror, commit_sha):
            log(f"fetching {origin}: commit {commit_sha[:12]} is not cached yet")
            _git(["fetch", "--prune", "--quiet", "origin"], cwd=mirror, step="fetch")
        if not _has_commit(mirror, commit_sha):
            raise CheckoutError(
                f"commit {commit_sha} is not in {origin}: push it, then submit again"
            )
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    _git(["clone", "--shared", "--no-checkout", "--quiet", str(mirror), str(target)], step="clone")
    _git(
        ["-c", "advice.detachedHead=false", "checkout", "--quiet", "--detach", commit_sha],
        cwd=target,
        step="checkout",
    )
    log(f"checked out {commit_sha[:12]} of {origin}")
    return target


def remove_checkout(home: Path, run_id: str) -> None:
    shutil.rmtree(checkout_path(home, run_id), ignore_errors=True)


def _head(path: Path) -> str | None:
    if not (path / ".git").exists():
        return None
    try:
        return _git(["rev-parse", "HEAD"], cwd=path, step="inspect").strip()
    except CheckoutError:
        return None


def _has_commit(mirror: Path, commit_sha: str) -> bool:
    try:
        _git(["cat-file", "-e", f"{commit_sha}^{{commit}}"], cwd=mirror, step="inspect")
    except CheckoutError:
        return False
    return True


def _git(args: list[str], *, step: str, cwd: Path | None = None) -> str:
    env = {**os.environ, **_GIT_ENV}
    try:
        done = subprocess.run(
            ["git", "-c", "core.hooksPath=/dev/null", *args],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=_GIT_TIMEOUT_SEC,
        )
    except FileNotFoundError:
        raise CheckoutError("git is not installed on the platform server") from None
    except subprocess.TimeoutExpired:
        raise CheckoutError(f"git {step} took longer than {_GIT_TIMEOUT_SEC:g} s") from None
    if done.returncode != 0:
        tail = [line for line in done.stderr.splitlines() if line.strip()][-_TAIL_LINES:]
        said = _USERINFO.sub("***@", " / ".join(tail)) or f"exit code {done.returncode}"
        raise CheckoutError(f"git {step} failed: {said}")
    return done.stdout


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    # Two runs of one workspace may start together; one clones or fetches, the other waits.
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
