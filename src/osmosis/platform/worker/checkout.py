"""A run's code: the submitted commit of the workspace's `origin`, checked out for one run.

    path = checkout(home, workspace_id="ab12…", origin_url="file:///srv/ws.git",
                    commit_sha="3f2c…", run_id="9e1d…", log=print)

A bare mirror of each origin is cached per workspace under `<home>/git/` and fetched only when
it lacks the commit; each run then gets its own clone at that commit under
`<home>/checkouts/<run_id>`, sharing the mirror's objects. Local paths and `file://` origins
work like any other URL. Failures raise `CheckoutError` with git's own last words.

The tree is the pushed repository's: it may hold symbolic links anywhere (a committed
`.osmosis -> /etc`, `configs/eval -> /somewhere`). The platform writes into it only through
`write_in_tree`, which never follows one, and keeps what the repository must not redirect
(the run's dataset copy) beside it in `inputs_path(home, run_id)`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

from osmosis.platform.services.origins import (
    CLONE_ALLOW_ENV,
    CloneAllow,
    check_clone_url,
    parse_clone_allow,
)
from osmosis.workspace import redact_url

_GIT_TIMEOUT_SEC = 600.0
_TAIL_LINES = 5
# Never prompt (there is no terminal), never run a hook or a credential helper of the mirror.
_GIT_ENV = {"GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true", "SSH_ASKPASS": "true"}
# No `ext::`/`fd::` helpers, even through a submodule or a redirect (issue 13.3).
_GIT_ENV["GIT_ALLOW_PROTOCOL"] = "file:git:http:https:ssh"
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
    allow: CloneAllow | None = None,
) -> Path:
    """A working tree of `origin_url` at `commit_sha` for run `run_id`; reused when present.

    `origin_url` must pass the clone allowlist `allow` (default: `OSMOSIS_CLONE_ALLOW` of this
    process's environment, which is where the worker's settings come from), checked before
    git touches it on every run: the setting may have changed since the workspace was made.
    """
    try:
        rules = parse_clone_allow(os.environ.get(CLONE_ALLOW_ENV)) if allow is None else allow
        check_clone_url(rules, origin_url)
    except ValueError as error:
        raise CheckoutError(str(error)) from None
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
            # --no-local: a local origin is fetched through git's transport, never hard-linked
            # (the user's 0444 object files would stay theirs, not private to the home) and
            # never borrowed through the origin's `objects/info/alternates`.
            _git(
                ["clone", "--mirror", "--no-local", "--quiet", "--", origin_url, str(mirror)],
                step="clone",
            )
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


def inputs_path(home: Path, run_id: str) -> Path:
    """A directory of the run's inputs that no repository controls (beside its checkout)."""
    return home / "checkouts" / f"{run_id}.inputs"


def remove_checkout(home: Path, run_id: str) -> None:
    shutil.rmtree(checkout_path(home, run_id), ignore_errors=True)
    shutil.rmtree(inputs_path(home, run_id), ignore_errors=True)


_NO_FOLLOW_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def write_in_tree(tree: Path, relative: str, data: bytes) -> Path:
    """Write `data` to `tree/relative`, creating directories, never through a link.

    Each directory is opened relative to its parent with `O_NOFOLLOW`, so a directory the
    repository committed as a symbolic link is refused (`CheckoutError` naming it) rather than
    written through; a link or file at the final name is replaced, never written through.

        write_in_tree(tree, "configs/eval/qa.toml", text.encode())
    """
    parts = relative.split("/")
    if not relative or relative.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise CheckoutError(f"{relative!r} is not a path inside the repository")
    folder = os.open(tree, _NO_FOLLOW_DIR)
    try:
        for index, part in enumerate(parts[:-1]):
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o700, dir_fd=folder)
            try:
                inner = os.open(part, _NO_FOLLOW_DIR, dir_fd=folder)
            except OSError as error:
                where = "/".join(parts[: index + 1])
                linked = _is_link(part, folder)
                raise CheckoutError(_not_a_directory(where, error, linked=linked)) from None
            os.close(folder)
            folder = inner
        name = parts[-1]
        try:
            if stat.S_ISDIR(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode):
                raise CheckoutError(f"{relative} is a directory in the repository, not a file")
            os.unlink(name, dir_fd=folder)  # a committed file or link there is replaced
        except FileNotFoundError:
            pass
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        with os.fdopen(os.open(name, flags, 0o600, dir_fd=folder), "wb") as handle:
            handle.write(data)
    finally:
        os.close(folder)
    return tree / relative


def _is_link(name: str, folder: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _not_a_directory(where: str, error: OSError, *, linked: bool) -> str:
    # Linux answers ENOTDIR (with O_DIRECTORY) or ELOOP for a link opened with O_NOFOLLOW.
    if linked or error.errno == errno.ELOOP:
        return (
            f"{where} is a symbolic link in the repository; the platform writes the run's "
            "files there and never through a link: commit it as a real directory"
        )
    return f"{where} in the repository is not a directory ({error.strerror})"


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
