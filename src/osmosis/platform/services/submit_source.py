"""Where a run's code comes from when the client names only its workspace: the official
`osmosis eval submit` sends the config's values, never a repository, a commit or a file.

    url = clone_url("acme/evals", parse_url_rewrite(settings.git_url_rewrite))  # url_rewrite
    source = resolve_commit(url, branch=None, commit_sha=None, allow=allow)
    source.commit_sha, source.branch              # the default branch's tip, and its name
    text = config_text(experiment={...}, evaluation={...}, advanced={}, env={}, required=[])

- **The origin** is the workspace's identity as a URL, rewritten by `OSMOSIS_GIT_URL_REWRITE`
  (`osmosis.platform.services.url_rewrite`). The rewritten URL is what the server clones, so
  it must pass `OSMOSIS_CLONE_ALLOW` itself: a rule never admits a repository the allowlist
  does not (checked here before `ls-remote`, and by the worker again before every clone).
- **The commit** is the config's `commit_sha` (a full id as given; a shorter one must match
  one branch or tag tip), else the tip of its `branch`, else of the default branch, as
  `git ls-remote` tells.
- **The config text** is written from the values sent, in the TOML our config reader takes.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from osmosis.eval.inputs.config_text import config_text as inputs_config_text
from osmosis.platform.core.errors import NotFound, PlatformError, ValidationFailed
from osmosis.platform.services.origins import CloneAllow, check_clone_url
from osmosis.platform.services.workspaces import OriginNotAllowed
from osmosis.workspace import redact_url

_FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
_SHORT_SHA = re.compile(r"^[0-9a-f]{7,39}$")
_LS_REMOTE_TIMEOUT_S = 60.0
# As the checkout's git: no prompt, no askpass helper, no `ext::` transport.
_GIT_ENV = {
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_ASKPASS": "true",
    "SSH_ASKPASS": "true",
    "GIT_ALLOW_PROTOCOL": "file:git:http:https:ssh",
}


class GitRemoteUnreachable(PlatformError):
    """`git ls-remote` of the workspace's origin failed: no such repository, no access, no
    network. (Not `GIT_REPOSITORY_ACCESS_DENIED`: the official CLI replaces that code's
    message with advice to log in again, which would hide git's reason.)"""

    code = "GIT_REMOTE_UNREACHABLE"
    status_code = 502


# -- the commit -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Source:
    """The commit a run checks out, and the branch it came from (None for a pinned commit
    no branch tip names)."""

    commit_sha: str
    branch: str | None


def resolve_commit(
    url: str, *, branch: str | None, commit_sha: str | None, allow: CloneAllow
) -> Source:
    """The commit to run: `commit_sha`, else `branch`'s tip, else the default branch's."""
    try:
        check_clone_url(allow, url)
    except ValueError as error:
        raise OriginNotAllowed(str(error), details={"origin": redact_url(url)}) from None
    sha = (commit_sha or "").strip().lower()
    if _FULL_SHA.match(sha):
        return Source(commit_sha=sha, branch=branch)
    if sha:
        if not _SHORT_SHA.match(sha):
            raise ValidationFailed(
                f"experiment.commit_sha {commit_sha!r} is not a commit id (7 to 40 hex digits)"
            )
        tips = {ref_sha for ref_sha, _ in _ls_remote(url, ["--heads", "--tags"])}
        found = sorted(tip for tip in tips if tip.startswith(sha))
        if len(found) != 1:
            raise ValidationFailed(
                f"experiment.commit_sha {commit_sha!r} names no single branch or tag tip of the "
                "origin: give the full 40-digit commit id",
                details={"matches": len(found)},
            )
        return Source(commit_sha=found[0], branch=branch)
    if branch:
        for ref_sha, ref in _ls_remote(url, ["--heads"], [f"refs/heads/{branch}"]):
            if ref == f"refs/heads/{branch}":
                return Source(commit_sha=ref_sha, branch=branch)
        raise NotFound(
            f"branch {branch!r} is not on the workspace's origin {redact_url(url)}: push it, "
            "then submit again",
            details={"branch": branch},
        )
    return _default_branch(url)


def _default_branch(url: str) -> Source:
    branch = sha = None
    for left, ref in _ls_remote(url, ["--symref"], ["HEAD"]):
        if ref != "HEAD":
            continue
        if left.startswith("ref: refs/heads/"):
            branch = left.removeprefix("ref: refs/heads/")
        elif _FULL_SHA.match(left):
            sha = left
    if branch is not None and sha is not None:
        return Source(commit_sha=sha, branch=branch)
    heads = _ls_remote(url, ["--heads"])
    if len(heads) == 1:  # HEAD names a branch never pushed (`git init --bare`, then `main`)
        tip, ref = heads[0]
        return Source(commit_sha=tip, branch=ref.removeprefix("refs/heads/"))
    raise NotFound(
        f"the workspace's origin {redact_url(url)} has no default branch"
        + (": push a commit" if not heads else ": set experiment.branch in the config"),
        details={"branches": [ref.removeprefix("refs/heads/") for _, ref in heads]},
    )


def _ls_remote(
    url: str, options: Sequence[str], patterns: Sequence[str] = ()
) -> list[tuple[str, str]]:
    """`git ls-remote OPTIONS URL PATTERNS` as (sha, ref) pairs; a `--symref` line's sha is
    `ref: refs/heads/…`."""
    command = ["git", "-c", "core.hooksPath=/dev/null", "ls-remote", *options, "--", url, *patterns]
    try:
        done = subprocess.run(
            command,
            env={**os.environ, **_GIT_ENV},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=_LS_REMOTE_TIMEOUT_S,
            check=False,
        )
    except FileNotFoundError:
        raise PlatformError("git is not installed on the platform server") from None
    except subprocess.TimeoutExpired:
        raise GitRemoteUnreachable(
            f"git ls-remote {redact_url(url)} got no answer within {_LS_REMOTE_TIMEOUT_S:g} s"
        ) from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        fatal = [line for line in lines if line.startswith("fatal:")]
        said = (fatal or lines or [f"exit code {done.returncode}"])[0]
        raise GitRemoteUnreachable(
            f"the server cannot read the workspace's origin {redact_url(url)}: {redact_url(said)}",
            details={"origin": redact_url(url)},
        )
    pairs = []
    for line in done.stdout.splitlines():
        left, _, ref = line.partition("\t")
        if ref:
            pairs.append((left.strip(), ref.strip()))
    return pairs


# -- the config text ------------------------------------------------------------------------
def config_text(
    *,
    experiment: Mapping[str, Any],
    evaluation: Mapping[str, Any],
    advanced: Mapping[str, Any],
    env: Mapping[str, str],
    required: Sequence[str],
) -> str:
    """The eval config the values describe, as TOML (`osmosis.eval.inputs.config_text`); a
    value TOML cannot hold is the client's to fix."""
    try:
        return inputs_config_text(
            experiment=experiment,
            evaluation=evaluation,
            advanced=advanced,
            env=env,
            required=required,
        )
    except ValueError as error:
        raise ValidationFailed(str(error)) from None


__all__ = ["GitRemoteUnreachable", "Source", "config_text", "resolve_commit"]
