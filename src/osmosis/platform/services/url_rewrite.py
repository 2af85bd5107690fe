"""`OSMOSIS_GIT_URL_REWRITE`: where the server fetches a workspace's code from when a client
names only the workspace (the official `osmosis eval submit`).

    rules = parse_url_rewrite("https://github.com/acme/=/srv/mirrors/acme/")
    clone_url("acme/evals", rules)   # '/srv/mirrors/acme/evals.git'

`FROM=TO` prefix rules, comma- or blank-separated; the longest matching FROM wins, as with
git's own `url.<TO>.insteadOf=<FROM>`. The rewritten URL is what the server clones, so it
must pass `OSMOSIS_CLONE_ALLOW` itself (`osmosis.platform.services.submit_source` checks it).
Standard library only: the settings table parses it at start.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

URL_REWRITE_ENV = "OSMOSIS_GIT_URL_REWRITE"
_SPLIT = re.compile(r"[,\s]+")


def parse_url_rewrite(text: str | None) -> tuple[tuple[str, str], ...]:
    """The `FROM=TO` rules of `OSMOSIS_GIT_URL_REWRITE` (comma- or blank-separated), longest
    FROM first; raises `ValueError` naming every bad entry."""
    rules: list[tuple[str, str]] = []
    problems: list[str] = []
    for entry in (e for e in _SPLIT.split((text or "").strip()) if e):
        source, equals, target = entry.partition("=")
        if not equals or not source or not target:
            problems.append(
                f"{entry!r}: a rule is FROM=TO, e.g. https://github.com/acme/=/srv/git/"
            )
            continue
        rules.append((source, target))
    if problems:
        raise ValueError("; ".join(problems))
    return tuple(sorted(rules, key=lambda rule: len(rule[0]), reverse=True))


def workspace_origin(identity: str) -> str:
    """The URL a workspace identity stands for: `owner/repo` is GitHub's, `host/path` is
    https, `file:///path` is itself."""
    if identity.startswith("file://"):
        return identity
    if identity.count("/") == 1 and "." not in identity.split("/", 1)[0]:
        return f"https://github.com/{identity}.git"
    return f"https://{identity}.git"


def clone_url(identity: str, rules: Sequence[tuple[str, str]]) -> str:
    """The workspace's origin after the first (longest) matching rewrite rule, if any."""
    url = workspace_origin(identity)
    for source, target in rules:
        if url.startswith(source):
            return target + url[len(source) :]
    return url


__all__ = ["URL_REWRITE_ENV", "clone_url", "parse_url_rewrite", "workspace_origin"]
