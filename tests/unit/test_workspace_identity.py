"""Workspace identity from a git origin, the git lookups, and the required layout."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from osmosis.workspace import (
    REQUIRED_DIRS,
    WorkspaceError,
    canonical_identity,
    create_missing_dirs,
    missing_dirs,
    normalise_identity,
    redact_url,
    resolve_workspace,
)

BASE = Path("/work/tree")


@pytest.mark.parametrize(
    ("url", "identity"),
    [
        ("git@github.com:Example-Org/My-Workspace.git", "example-org/my-workspace"),
        ("git@github.com:O/R", "o/r"),
        ("https://github.com/O/R", "o/r"),
        ("https://github.com/O/R.git", "o/r"),
        ("https://github.com/O/R/", "o/r"),
        ("https://github.com/O/R.git/", "o/r"),
        ("ssh://git@github.com/O/R.git", "o/r"),
        ("ssh://git@github.com:22/O/R.git", "o/r"),
        ("git://github.com/O/R.git", "o/r"),
        ("https://www.github.com/O/R", "o/r"),
        ("https://user:tok3n@GitHub.com/O/R.git", "o/r"),
        ("  https://github.com/O/R.git\n", "o/r"),
        ("https://gitlab.example.com/a/b.git", "gitlab.example.com/a/b"),
        ("https://GitLab.Example.com:8443/Group/Sub/Repo.git", "gitlab.example.com/Group/Sub/Repo"),
        ("git@gitlab.example.com:a/b.git", "gitlab.example.com/a/b"),
        ("ssh://git@gitlab.example.com:2222/a/b.git", "gitlab.example.com/a/b"),
        ("/srv/git/ws.git", "file:///srv/git/ws"),
        ("/srv/git/ws/", "file:///srv/git/ws"),
        ("/srv/git/ws/.git", "file:///srv/git/ws"),
        ("file:///srv/git/ws.git", "file:///srv/git/ws"),
        ("file://localhost/srv/git/ws", "file:///srv/git/ws"),
        ("../remote.git", "file:///work/remote"),
        ("./a:b", "file:///work/tree/a:b"),
    ],
)
def test_normalise_identity(url, identity):
    assert normalise_identity(url, base=BASE) == identity
    # The server's canonical form leaves what the CLI sends exactly as it is.
    assert canonical_identity(identity) == identity


@pytest.mark.parametrize(
    ("spellings", "identity"),
    [
        # The three: a `.git` suffix, a trailing slash, an upper-case host.
        (
            [
                "git.example.com/team/alice",
                "git.example.com/team/alice.git",
                "git.example.com/team/alice/",
                "GIT.Example.COM/team/alice",
                "git@git.example.com/team/alice",
                "https://git.example.com:8443/team/alice.git",
                "ssh://git@GIT.example.com/team/alice/",
            ],
            "git.example.com/team/alice",
        ),
        (
            [
                "alice/repo",
                "Alice/Repo",
                "alice/repo.git",
                "alice/repo/",
                "github.com/Alice/Repo",
                "GitHub.com/alice/repo.git/",
                "www.github.com/alice/repo",
                "https://GITHUB.com/Alice/Repo.git",
                "git@github.com:Alice/Repo.git",
            ],
            "alice/repo",
        ),
        (
            [
                "file:///srv/git/alice",
                "file:///srv/git/alice.git",
                "file:///srv/git/alice/",
                "FILE://LOCALHOST/srv/git/alice.git",
                "/srv/git/alice.git",
                "/srv//git/alice/.git",
            ],
            "file:///srv/git/alice",
        ),
        # A path's case is the server's business on any other host, so it is kept.
        (["git.example.com/Team/Alice"], "git.example.com/Team/Alice"),
    ],
)
def test_every_spelling_of_an_identity_is_one_identity(spellings, identity):
    assert {canonical_identity(text) for text in spellings} == {identity}


@pytest.mark.parametrize(
    "text",
    [
        "",
        "repo",  # one part names no repository
        "alice/",
        "github.com/alice",
        "github.com/a/b/c",
        "ext::sh -c touch% /tmp/pwned",  # git would run it
        "fd::17",
        "has space/repo",
        "alice/repo\x00",
        "alice/re\npo",
        "file://other-host/srv/x",
        "a/../b",
    ],
)
def test_an_identity_that_names_no_repository_is_refused(text):
    with pytest.raises(ValueError):
        canonical_identity(text)


def test_transport_remotes_are_refused_as_urls_too():
    for url in ("ext::sh -c touch% /tmp/pwned", "fd::3"):
        with pytest.raises(ValueError, match="transport::address"):
            normalise_identity(url, base=BASE)


@pytest.mark.parametrize(
    "url",
    [
        "",
        "   ",
        "https://github.com/only-owner",
        "https://github.com/a/b/c",
        "https://host/",
        "file://other/x",
    ],
)
def test_urls_that_name_no_repository_are_refused(url):
    with pytest.raises(ValueError):
        normalise_identity(url, base=BASE)


def test_credentials_never_reach_an_error_message():
    with pytest.raises(ValueError) as caught:
        normalise_identity("https://me:hunter2@github.com/too/many/parts", base=BASE)
    assert "hunter2" not in str(caught.value)
    assert redact_url("https://me:hunter2@h/a.git") == "https://***@h/a.git"
    assert redact_url("https://TOKEN@h/a.git") == "https://***@h/a.git"
    assert redact_url("git@github.com:o/r.git") == "git@github.com:o/r.git"


def git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def test_a_repository_with_a_local_origin_resolves_from_a_subdirectory(tmp_path):
    remote, tree = tmp_path / "remote.git", tmp_path / "tree"
    remote.mkdir()
    tree.mkdir()
    git("init", "-q", cwd=tree)
    git("remote", "add", "origin", str(remote), cwd=tree)
    (tree / "sub").mkdir()
    workspace = resolve_workspace(tree / "sub")
    assert workspace.directory == tree.resolve()
    assert workspace.remote_url == str(remote)
    assert workspace.identity == f"file://{(tmp_path / 'remote').resolve()}"


def test_no_repository_or_no_origin_is_workspace_required(tmp_path):
    with pytest.raises(WorkspaceError) as outside:
        resolve_workspace(tmp_path)
    assert outside.value.code == "WORKSPACE_REQUIRED"
    git("init", "-q", cwd=tmp_path)
    with pytest.raises(WorkspaceError) as no_origin:
        resolve_workspace(tmp_path)
    assert no_origin.value.code == "WORKSPACE_REQUIRED"
    assert "git remote add origin" in no_origin.value.hint


def test_layout_check_and_fix(tmp_path):
    assert missing_dirs(tmp_path) == list(REQUIRED_DIRS)
    (tmp_path / "data").mkdir()
    assert create_missing_dirs(tmp_path) == ["rollouts", "configs/eval"]
    assert missing_dirs(tmp_path) == []
    assert create_missing_dirs(tmp_path) == []
