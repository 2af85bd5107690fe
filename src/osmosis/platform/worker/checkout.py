"""A run's code: the submitted commit of the workspace's `origin`, checked out for one run.

    path = checkout(home, workspace_id="ab12…", origin_url="file:///srv/ws.git",
                    commit_sha="3f2c…", run_id="9e1d…", log=print)

A bare mirror of each origin is cached per workspace under `<home>/git/` and fetched only when
it lacks the commit; each run then gets its own clone at that commit under
`<home>/checkouts/<run_id>`, sharing the mirror's objects. Local paths and `file://` origins
work like any other URL. Failures raise `CheckoutError` with git's own last words.

The repository is bounded (`RepoLimits`: `OSMOSIS_REPO_MAX_BYTES`, `OSMOSIS_REPO_MAX_FILES`).
git cannot cap what a clone or fetch downloads, so the mirror is measured right after it
(`git count-objects`), and the commit's files are counted and summed from its tree
(`git ls-tree`) before anything is checked out. Over a limit, the mirror is removed and
`CheckoutError` names the limit, its setting and the measured figure. Mirrors of workspaces
that no longer exist are removed by `remove_stale_mirrors`, which the scheduler calls.

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
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from osmosis.platform.services.origins import (
    CLONE_ALLOW_ENV,
    CloneAllow,
    check_clone_url,
    parse_clone_allow,
)
from osmosis.vocabulary import format_bytes
from osmosis.workspace import redact_url

_GIT_TIMEOUT_SEC = 600.0
_TAIL_LINES = 5
# Never prompt (there is no terminal), never run a hook or a credential helper of the mirror.
_GIT_ENV = {"GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true", "SSH_ASKPASS": "true"}
# No `ext::`/`fd::` helpers, even through a submodule or a redirect (issue 13.3).
_GIT_ENV["GIT_ALLOW_PROTOCOL"] = "file:git:http:https:ssh"
_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")  # a token in a URL that git quotes back


REPO_MAX_BYTES_ENV = "OSMOSIS_REPO_MAX_BYTES"
REPO_MAX_FILES_ENV = "OSMOSIS_REPO_MAX_FILES"


class CheckoutError(Exception):
    """The commit could not be checked out; the message says which step failed and why."""


@dataclass(frozen=True)
class RepoLimits:
    """How large a workspace repository may be; 0: no limit.

    `max_bytes` bounds the mirror on disk (after each clone or fetch) and the commit's files;
    `max_files` the files of the commit.

        RepoLimits(max_bytes=1 << 30, max_files=100_000)
    """

    max_bytes: int = 1024**3
    max_files: int = 100_000

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> RepoLimits:
        """The limits `environ` sets (the worker's settings arrive in its environment)."""
        try:
            return cls(
                max_bytes=int(environ.get(REPO_MAX_BYTES_ENV) or cls.max_bytes),
                max_files=int(environ.get(REPO_MAX_FILES_ENV) or cls.max_files),
            )
        except ValueError as error:
            raise CheckoutError(f"a repository limit is not a number: {error}") from None


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
    limits: RepoLimits | None = None,
) -> Path:
    """A working tree of `origin_url` at `commit_sha` for run `run_id`; reused when present.

    `origin_url` must pass the clone allowlist `allow` (default: `OSMOSIS_CLONE_ALLOW` of this
    process's environment, which is where the worker's settings come from), checked before
    git touches it on every run: the setting may have changed since the workspace was made.
    The repository must stay within `limits` (default: `OSMOSIS_REPO_MAX_BYTES` and
    `OSMOSIS_REPO_MAX_FILES` of the environment); a mirror over them is removed.
    """
    try:
        rules = parse_clone_allow(os.environ.get(CLONE_ALLOW_ENV)) if allow is None else allow
        check_clone_url(rules, origin_url)
    except ValueError as error:
        raise CheckoutError(str(error)) from None
    limits = RepoLimits.from_env(os.environ) if limits is None else limits
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
        cached = _has_commit(mirror, commit_sha)
        if not cached:
            log(f"fetching {origin}: commit {commit_sha[:12]} is not cached yet")
            _git(["fetch", "--prune", "--quiet", "origin"], cwd=mirror, step="fetch")
        try:
            # Measured on every run: the limits may have been lowered since the last fetch.
            _check_mirror_size(mirror, limits)
            if not cached and not _has_commit(mirror, commit_sha):
                raise CheckoutError(
                    f"commit {commit_sha} is not in {origin}: push it, then submit again"
                )
            _check_commit_files(mirror, commit_sha, limits)
        except _OverLimit as error:
            shutil.rmtree(mirror, ignore_errors=True)  # an oversized push is not kept
            raise CheckoutError(f"{origin}: {error}; its mirror was removed") from None
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


def remove_stale_mirrors(home: Path, *, workspace_ids: Callable[[], Collection[str]]) -> int:
    """Remove the mirrors of workspaces that no longer exist; the number removed.

    The mirror directories are listed before `workspace_ids()` is asked, so a workspace
    created meanwhile (and its first clone) is never mistaken for a deleted one.

        remove_stale_mirrors(home, workspace_ids=lambda: {"ab12…"})
    """
    root = home / "git"
    try:
        with os.scandir(root) as entries:
            present = [entry.name for entry in entries if entry.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return 0
    if not present:
        return 0
    known = set(workspace_ids())
    removed = 0
    for name in present:
        if name not in known:
            shutil.rmtree(root / name, ignore_errors=True)
            removed += 1
    return removed


class _OverLimit(Exception):
    """A repository limit was exceeded; the message names it, its setting and the figure."""


def _check_mirror_size(mirror: Path, limits: RepoLimits) -> None:
    if not limits.max_bytes:
        return
    counts: dict[str, int] = {}
    for line in _git(["count-objects", "-v"], cwd=mirror, step="inspect").splitlines():
        key, _, value = line.partition(":")
        with contextlib.suppress(ValueError):
            counts[key.strip()] = int(value.strip())
    # Loose objects, packs and garbage, in KiB: what the mirror takes on disk.
    size = 1024 * sum(counts.get(key, 0) for key in ("size", "size-pack", "size-garbage"))
    if size > limits.max_bytes:
        raise _OverLimit(
            f"the repository is {format_bytes(size)} ({size:,} bytes) after the fetch, over "
            f"the limit of {format_bytes(limits.max_bytes, exact=True)} ({REPO_MAX_BYTES_ENV}="
            f"{limits.max_bytes})"
        )


def _check_commit_files(mirror: Path, commit_sha: str, limits: RepoLimits) -> None:
    """Count and sum the commit's files from its tree, stopping at the first limit passed."""
    if not limits.max_files and not limits.max_bytes:
        return
    files = size = 0
    args = ["git", "-c", "core.hooksPath=/dev/null", "ls-tree", "-r", "-l", "-z", commit_sha]
    with subprocess.Popen(
        args,
        cwd=mirror,
        env={**os.environ, **_GIT_ENV},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    ) as listing:
        assert listing.stdout is not None
        rest = b""
        try:
            while chunk := listing.stdout.read(1 << 16):
                *entries, rest = (rest + chunk).split(b"\0")
                for entry in entries:
                    # "<mode> <type> <object> <size>\t<path>"; a submodule's size is "-".
                    fields = entry.split(b"\t", 1)[0].split()
                    files += 1
                    if len(fields) == 4 and fields[3].isdigit():
                        size += int(fields[3])
                if limits.max_files and files > limits.max_files:
                    raise _OverLimit(
                        f"commit {commit_sha[:12]} holds more than {limits.max_files:,} files, "
                        f"the limit ({REPO_MAX_FILES_ENV}={limits.max_files})"
                    )
                if limits.max_bytes and size > limits.max_bytes:
                    raise _OverLimit(
                        f"the files of commit {commit_sha[:12]} are at least "
                        f"{format_bytes(size)} ({size:,} bytes), over the limit of "
                        f"{format_bytes(limits.max_bytes, exact=True)} ({REPO_MAX_BYTES_ENV}="
                        f"{limits.max_bytes})"
                    )
        finally:
            listing.kill()
    if listing.returncode not in (0, -9):
        raise CheckoutError(f"git could not list the files of commit {commit_sha[:12]}")


def inputs_path(home: Path, run_id: str) -> Path:
    """A directory of the run's inputs that no repository controls (beside its checkout)."""
    return home / "checkouts" / f"{run_id}.inputs"


def remove_checkout(home: Path, run_id: str) -> None:
    delete_set_aside(set_aside_checkout(home, run_id))


# Where `set_aside_checkout` moves a run's checkout: no run id starts with a dot.
_SET_ASIDE = ".removed-"


def set_aside_checkout(home: Path, run_id: str) -> list[Path]:
    """Move the run's checkout and inputs out of its paths at once (a rename each), and
    return where they went, for `delete_set_aside` once the run's status is written: a
    checkout's removal took ~0.1 s of the end of every run (issue 30). A worker killed
    between the two leaves them to `remove_set_aside`."""
    moved = []
    for path in (checkout_path(home, run_id), inputs_path(home, run_id)):
        aside = path.with_name(f"{_SET_ASIDE}{path.name}-{os.getpid()}")
        try:
            path.rename(aside)
        except FileNotFoundError:
            continue
        except OSError:  # a leftover of the same name (a reused pid): removed in place
            shutil.rmtree(path, ignore_errors=True)
            continue
        moved.append(aside)
    return moved


def delete_set_aside(paths: Collection[Path]) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def remove_set_aside(home: Path) -> int:
    """Remove what workers killed after `set_aside_checkout` left; the number removed."""
    try:
        with os.scandir(home / "checkouts") as entries:
            left = [Path(e.path) for e in entries if e.name.startswith(_SET_ASIDE)]
    except FileNotFoundError:
        return 0
    delete_set_aside(left)
    return len(left)


SPARE_PREFIX = ".spare-"
"""`<SPARE_PREFIX><pid>`: a warm worker's spare checkout, and its server's directory under the
runs' root (`run_worker._start_spare`); no run id starts with a dot."""


def remove_dead_spares(home: Path, runs: Path) -> int:
    """Remove the spare checkouts and server directories of warm workers no longer alive
    (killed: a server's stop, a SIGKILL); the number removed."""
    removed = 0
    for parent in (home / "checkouts", runs):
        try:
            with os.scandir(parent) as entries:
                names = [e.name for e in entries if e.name.startswith(SPARE_PREFIX)]
        except FileNotFoundError:
            continue
        for name in names:
            pid = name.removeprefix(SPARE_PREFIX)
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                shutil.rmtree(parent / name, ignore_errors=True)
                removed += 1
    return removed


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
