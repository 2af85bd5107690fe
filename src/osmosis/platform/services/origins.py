"""Which git origins the server may clone: the allowlist `OSMOSIS_CLONE_ALLOW`.

    allow = parse_clone_allow("github.com/acme/*, /srv/git")
    origin_problem(allow, "acme/evals", by_admin=False)           # None: allowed
    origin_problem(allow, "file:///home/bea/private", by_admin=True)  # why not, as a sentence

The server clones with its own credentials and its own file access, so whoever names an
origin borrows them. Entries (separated by commas or blanks):

- `host/path` glob for remote repositories (https, ssh, git): `github.com/acme/*`,
  `git.example.com/team/**`, `**` for every remote. `*` and `?` stay inside one path part,
  `**` spans parts. GitHub's `owner/repo` identities are matched as `github.com/owner/repo`,
  case-insensitively (GitHub's names are); other hosts' paths case-sensitively.
- An absolute path (or `file://` URL): a local root. Repositories at or below it, symlinks
  resolved, may be cloned.

Unset, the default serves the embedded single-user setup (`make demo`) and nothing more:
any remote origin, and a local repository only in a workspace an admin creates and only
when it belongs to the server's own OS user (a directory that does not exist yet is
checked again at clone time). Set, it is the whole rule, for admins too.

Checked when a workspace is created (`by_admin` known) and again before every clone or
fetch (`by_admin=None`: the default's owner check still applies). `check_clone_url` also
refuses URLs git would read as options or as `transport::address` programs.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from osmosis.workspace import normalise_identity, redact_url

__all__ = [
    "CLONE_ALLOW_ENV",
    "CloneAllow",
    "check_clone_url",
    "origin_problem",
    "parse_clone_allow",
]

CLONE_ALLOW_ENV = "OSMOSIS_CLONE_ALLOW"
# What git itself may use to fetch (also pinned with GIT_ALLOW_PROTOCOL at clone time).
CLONE_SCHEMES = frozenset({"file", "git", "http", "https", "ssh"})
_SPLIT = re.compile(r"[,\s]+")


@dataclass(frozen=True)
class CloneAllow:
    """The parsed allowlist; `configured` is False for the default (the setting is unset)."""

    patterns: tuple[str, ...] = ()
    roots: tuple[Path, ...] = ()
    configured: bool = False

    def describe(self) -> str:
        if not self.configured:
            return f"{CLONE_ALLOW_ENV} is unset"
        entries = [*self.patterns, *(str(root) for root in self.roots)]
        return f"{CLONE_ALLOW_ENV}={', '.join(entries)}"


def parse_clone_allow(text: str | None) -> CloneAllow:
    """The allowlist in `text` (None or blank: the default); every bad entry is named at once."""
    if text is None or not text.strip():
        return CloneAllow()
    patterns: list[str] = []
    roots: list[Path] = []
    problems: list[str] = []
    for entry in (e for e in _SPLIT.split(text.strip()) if e):
        if entry.lower().startswith("file://") or entry.startswith(("/", "~", ".")):
            path = Path(unquote(urlsplit(entry).path) if "://" in entry else entry).expanduser()
            if not path.is_absolute() or ".." in path.parts:
                problems.append(f"{entry!r}: a local root is an absolute path without '..'")
                continue
            roots.append(path.resolve())
            continue
        pattern = _pattern(entry)
        if pattern is None:
            problems.append(
                f"{entry!r}: a remote pattern is host/path (github.com/acme/*), '**' for any, "
                "or an absolute path for a local root"
            )
            continue
        patterns.append(pattern)
    if problems:
        raise ValueError("; ".join(problems))
    return CloneAllow(patterns=tuple(patterns), roots=tuple(roots), configured=True)


def _pattern(entry: str) -> str | None:
    """The pattern as matched (host lower-cased, no scheme, user or port), or None if unusable."""
    if entry == "**":
        return entry
    text = re.sub(r"^[A-Za-z][A-Za-z0-9+.-]*://", "", entry)
    host, _, path = text.partition("/")
    host = host.rpartition("@")[2].split(":", 1)[0].lower()
    path = path.strip("/")
    if path.endswith(".git"):
        path = path[: -len(".git")]
    if not re.fullmatch(r"[a-z0-9*?\[][a-z0-9.*?_\[\]:-]*", host) or not path:
        return None
    if ".." in path.split("/"):
        return None
    if host in {"github.com", "www.github.com"}:
        return f"github.com/{path.lower()}"
    return f"{host}/{path}"


def _glob(pattern: str) -> re.Pattern[str]:
    out: list[str] = []
    index = 0
    while index < len(pattern):
        if pattern.startswith("**", index):
            out.append(".*")
            index += 2
            continue
        char = pattern[index]
        out.append("[^/]*" if char == "*" else "[^/]" if char == "?" else re.escape(char))
        index += 1
    return re.compile("".join(out))


def _remote_targets(identity: str) -> tuple[str, ...]:
    """What remote patterns match: `host/path`. A GitHub identity has no host (owner/repo);
    a dotless two-part one may also be `gitserver/repo` (see `osmosis.workspace`): both."""
    first = identity.split("/", 1)[0]
    if identity.count("/") == 1 and "." not in first and ":" not in first:
        return (f"github.com/{identity}", identity)
    return (identity,)


def _owned_by_server(path: Path) -> bool | None:
    """Whether the repository at `path` (or `path.git`) belongs to this process's OS user;
    None when neither exists (git will say so when it tries)."""
    candidates = [path, path.with_name(path.name + ".git")] if path.name else [path]
    for candidate in candidates:
        try:
            return candidate.stat().st_uid == os.geteuid()
        except FileNotFoundError:
            continue
        except OSError:
            return False
    return None


def origin_problem(
    allow: CloneAllow, identity: str, *, by_admin: bool | None, path: Path | None = None
) -> str | None:
    """Why the server may not clone the workspace `identity` (a canonical identity), or None.

    `by_admin`: whether an admin is creating the workspace; None at clone time. `path`: the
    local path actually cloned (default: the identity's own path).
    """
    if identity.startswith("file://"):
        local = Path(os.path.realpath(path or identity[len("file://") :]))
        if allow.configured:
            if any(local == root or local.is_relative_to(root) for root in allow.roots):
                return None
            where = ", ".join(str(r) for r in allow.roots) or "none"
            return (
                f"the server may not clone the local path {local}: it is under no local root "
                f"of {CLONE_ALLOW_ENV} ({where})"
            )
        if by_admin is False:
            return (
                f"the server may not clone the local path {local} for you: with "
                f"{CLONE_ALLOW_ENV} unset only an admin's workspaces use local paths"
            )
        if _owned_by_server(local) is False:
            return (
                f"the server may not clone the local path {local}: it belongs to another user "
                f"than the server's; list a root in {CLONE_ALLOW_ENV} to allow it"
            )
        return None
    if not allow.configured:
        return None
    targets = _remote_targets(identity)
    globs = [_glob(pattern) for pattern in allow.patterns]
    if any(glob.fullmatch(target) for glob in globs for target in targets):
        return None
    return f"the server may not clone {targets[0]}: {allow.describe()} does not allow it"


def check_clone_url(allow: CloneAllow, url: str) -> None:
    """Refuse, before git runs, a URL the allowlist does not admit or git would misread.

    Raises `ValueError` with the reason (credentials in the URL never appear in it).
    """
    text = url.strip()
    shown = redact_url(text)
    if not text or text.startswith("-"):
        raise ValueError(f"{shown!r} is not a repository URL")
    if "://" in text:
        scheme = text.split("://", 1)[0].lower()
        if scheme not in CLONE_SCHEMES:
            allowed = ", ".join(sorted(CLONE_SCHEMES))
            raise ValueError(f"the server clones only {allowed} URLs, not {shown!r}")
    elif not text.startswith("/") and not re.match(r"^[^/:]{2,}:", text.rpartition("@")[2]):
        raise ValueError(f"{shown!r} is neither an absolute path nor a repository URL")
    identity = normalise_identity(text, base=Path("/"))  # ValueError for transport::address
    local: Path | None = None
    if identity.startswith("file://"):
        local = Path(unquote(urlsplit(text).path) if "://" in text else text)
    problem = origin_problem(allow, identity, by_admin=None, path=local)
    if problem is not None:
        raise ValueError(problem)
