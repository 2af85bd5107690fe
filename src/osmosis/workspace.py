"""The local workspace: the git top level, its `origin`, the identity sent to the platform,
and the required directory layout.

    ws = resolve_workspace(Path.cwd())
    ws.identity  # 'example-org/my-workspace', sent as the X-Osmosis-Git header

Identity forms (`normalise_identity`):

- GitHub (`github.com`, `www.github.com`) in SCP, `ssh://`, `git://` or `http(s)://` form:
  hostless, lower-cased `owner/repo`.
- Any other host: `host/path`, host lower-cased, path kept as written (servers other than
  GitHub may be case-sensitive), without user, password, port or a trailing `.git`.
  The port is dropped so that the ssh and https URLs of one repository agree. One exception:
  a two-part `host/repo` whose host has no dot (`ssh://gitserver/Repo`) reads exactly like
  GitHub's `owner/repo`, so it is lower-cased as GitHub's is.
- A local path or a `file://` URL: `file://` + the absolute, symlink-resolved path with a
  trailing `.git` removed, e.g. `/srv/git/ws.git` -> `file:///srv/git/ws`. A relative path
  is taken relative to the work tree, as git does for a remote added from the top level.
- git's `transport::address` remotes (`ext::…`, `fd::…`) name no repository and are refused.

The platform does not trust the identity a client sends: `canonical_identity` brings any
spelling (`…/alice.git`, `…/alice/`, an upper-case host, a URL) to the one form above, and
`canonical_identity(normalise_identity(url)) == normalise_identity(url)` for every URL.

Standard library and the `git` executable only: every CLI command may import this.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

__all__ = [
    "REQUIRED_DIRS",
    "Workspace",
    "WorkspaceError",
    "canonical_identity",
    "create_missing_dirs",
    "find_top_level",
    "git_missing",
    "missing_dirs",
    "normalise_identity",
    "origin_url",
    "redact_url",
    "resolve_workspace",
    "run_git",
]

# Directories every workspace command expects under the git top level.
REQUIRED_DIRS: tuple[str, ...] = ("rollouts", "configs/eval", "data")

GITHUB_HOSTS = frozenset({"github.com", "www.github.com"})
ORIGIN_HINT = "git remote add origin <url>   (any git URL or a local path works)"

# `[user@]host:path` with no slash before the colon, as git itself decides (see git's
# url.c / connect.c): `./a:b` and `/a:b` are paths, `host:a/b` is SSH.
_SCP = re.compile(r"^(?:(?P<user>[^@/]+)@)?(?P<host>[^:/]+):(?P<path>.+)$")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# A host: no blank, no path or user separator (the URL parser already took those apart).
_HOST = re.compile(r"^[^\s/@]+$")


class WorkspaceError(Exception):
    """No usable workspace here; `code` is the CLI error code, `hint` the fix."""

    def __init__(self, message: str, *, code: str = "WORKSPACE_REQUIRED", hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.hint = hint


@dataclass(frozen=True)
class Workspace:
    """A git work tree with an origin: where it is and who the platform knows it as."""

    directory: Path
    remote_url: str
    identity: str


def _strip_git(path: str) -> str:
    path = path.rstrip("/")
    if path.endswith(".git"):
        path = path[: -len(".git")].rstrip("/")
    return path


def _remote(host: str, path: str, original: str) -> str:
    host = host.lower()
    path = _strip_git(unquote(path).strip("/"))
    segments = [s for s in path.split("/") if s]
    if (
        not _HOST.match(host)
        or not segments
        or any(s in {".", ".."} or not s.isprintable() or s != s.strip() for s in segments)
    ):
        raise ValueError(f"not a git remote URL: {redact_url(original)!r}")
    if host in GITHUB_HOSTS:
        if len(segments) != 2:
            raise ValueError(
                f"a GitHub URL names owner/repo, got {redact_url(original)!r}",
            )
        return "/".join(segments).lower()
    if len(segments) == 1 and not _looks_like_host(host):
        # `gitserver/Repo` cannot be told from GitHub's `owner/repo`: compare it as GitHub's.
        return f"{host}/{segments[0].lower()}"
    return f"{host}/{'/'.join(segments)}"


def _looks_like_host(segment: str) -> bool:
    """A domain, an address or `localhost`, as opposed to a GitHub owner (never has a dot)."""
    return "." in segment or ":" in segment or segment.lower() == "localhost"


def _local(path: str, base: Path | None) -> str:
    candidate = Path(path).expanduser()
    if not candidate.is_absolute():
        candidate = (base or Path.cwd()) / candidate
    resolved = _strip_git(candidate.resolve().as_posix())
    return f"file://{resolved or '/'}"


def normalise_identity(url: str, *, base: Path | None = None) -> str:
    """The workspace identity for a git remote URL (see the module docstring for the forms).

        normalise_identity("git@github.com:Example-Org/My-Workspace.git")
        # 'example-org/my-workspace'

    `base` anchors a relative local path (default: the current directory). A URL that names
    no repository raises `ValueError`; credentials in a URL never reach the identity.
    """
    text = url.strip()
    if not text:
        raise ValueError("the remote URL is empty")
    if _SCHEME.match(text):
        parts = urlsplit(text)
        scheme = parts.scheme.lower()
        if scheme == "file":
            if (parts.hostname or "") not in {"", "localhost"}:
                raise ValueError(
                    f"file:// URLs on another host are not supported: {redact_url(text)!r}"
                )
            return _local(unquote(parts.path), base)
        return _remote(parts.hostname or "", parts.path, text)
    scp = _SCP.match(text)
    # A one-letter "host" is a Windows drive (C:\repo), never an SSH host.
    if scp and len(scp.group("host")) > 1:
        if scp.group("path").startswith(":"):
            raise ValueError(
                f"{redact_url(text)!r} is a git `transport::address` remote, not a repository URL"
            )
        return _remote(scp.group("host"), scp.group("path"), text)
    return _local(text, base)


def canonical_identity(text: str) -> str:
    """The one identity of the workspace `text` names: an identity in any spelling, or a URL.

        canonical_identity("GitHub.com/Alice/Repo.git/")  # 'alice/repo'
        canonical_identity("git.example.com/Team/ws/")    # 'git.example.com/Team/ws'

    What the platform applies to the `X-Osmosis-Git` header. `text` may be an identity as
    `normalise_identity` gives it (`owner/repo`, `host/path`, `file:///path`), the same with a
    trailing slash or `.git`, an upper-case host or a user part, or any git URL or absolute
    path. A relative path is read as an identity, never as a directory of the server.
    Raises `ValueError` naming the problem.
    """
    text = text.strip()
    if not text or not text.isprintable():
        raise ValueError("a workspace identity is 1 or more printable characters")
    scp = _SCP.match(text)
    if _SCHEME.match(text) or text.startswith("/") or (scp and len(scp.group("host")) > 1):
        return normalise_identity(text, base=Path("/"))
    first, _, rest = text.partition("/")
    if not rest.strip("/"):
        raise ValueError(
            f"{text!r} is not a workspace identity: expected owner/repo, host/path or file:///path"
        )
    # `owner/repo` is `_remote`'s dotless two-part case; `host/path` and `github.com/o/r` too.
    return _remote(first.rpartition("@")[2].strip("[]"), rest, text)


def redact_url(url: str) -> str:
    """`url` without a password or token in its user part (safe to print or return).

    redact_url("https://me:tok@host/a.git")  # 'https://***@host/a.git'
    """
    if not _SCHEME.match(url.strip()):
        return url
    parts = urlsplit(url.strip())
    if "@" not in parts.netloc:
        return url
    # The whole user part goes: a bare user may itself be a token (https://TOKEN@host/...).
    userinfo, host = "***@", parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, userinfo + host, parts.path, parts.query, parts.fragment))


def run_git(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`git -C cwd args…`, its output captured; `WorkspaceError` when git is missing."""
    try:
        return subprocess.run(
            ["git", "-C", str(cwd), *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except FileNotFoundError:
        raise git_missing() from None


def git_missing() -> WorkspaceError:
    """The error of a git command that could not start: git is not installed."""
    return WorkspaceError(
        "git is not installed; osmosis finds the workspace through git",
        hint="install git, then run this command inside a git work tree",
    )


def find_top_level(start: Path) -> Path:
    """The work tree's top level containing `start` (`git rev-parse --show-toplevel`)."""
    result = run_git("rev-parse", "--show-toplevel", cwd=start)
    if result.returncode != 0 or not result.stdout.strip():
        raise WorkspaceError(
            f"{start} is not inside a git work tree; a workspace is a git repository",
            hint=f"git init && {ORIGIN_HINT}",
        )
    return Path(result.stdout.strip())


def origin_url(top_level: Path) -> str:
    """The URL of the `origin` remote (`git remote get-url origin`)."""
    result = run_git("remote", "get-url", "origin", cwd=top_level)
    if result.returncode != 0 or not result.stdout.strip():
        raise WorkspaceError(
            f"the git repository at {top_level} has no `origin` remote; its URL names the "
            "workspace on the platform",
            hint=ORIGIN_HINT,
        )
    return result.stdout.strip()


def resolve_workspace(start: Path) -> Workspace:
    """The workspace containing `start`: top level, origin URL and identity."""
    top = find_top_level(start)
    url = origin_url(top)
    try:
        identity = normalise_identity(url, base=top)
    except ValueError as error:
        raise WorkspaceError(
            f"cannot use origin {redact_url(url)!r}: {error}", hint=ORIGIN_HINT
        ) from None
    return Workspace(directory=top, remote_url=url, identity=identity)


def missing_dirs(directory: Path) -> list[str]:
    """The required directories (`REQUIRED_DIRS`) absent from `directory`, in table order."""
    return [name for name in REQUIRED_DIRS if not (directory / name).is_dir()]


def create_missing_dirs(directory: Path) -> list[str]:
    """Create the missing required directories locally; returns those created."""
    created = missing_dirs(directory)
    for name in created:
        (directory / name).mkdir(parents=True, exist_ok=True)
    return created
