"""Workspaces: one per normalised origin, created by whom the policy allows, for origins the
server may clone, visible to members only; checked and fixed by doctor.

Real server processes and real git repositories, driven through the CLI and over HTTP (the
migration and the allowlist's parsing are checked in process).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx
import pytest

from tests.platform.conftest import (
    CLI,
    RunningPlatform,
    clean_env,
    free_port,
    osmosis,
    osmosis_json,
)

pytestmark = pytest.mark.slow


def cli(*args: str, env: Mapping[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], env=dict(env), cwd=cwd, capture_output=True, text=True, timeout=90
    )


def cli_json(*args: str, env: Mapping[str, str], cwd: Path) -> dict:
    result = cli("--json", *args, env=env, cwd=cwd)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def cli_error(*args: str, env: Mapping[str, str], cwd: Path) -> dict:
    result = cli("--json", *args, env=env, cwd=cwd)
    assert result.returncode == 1, result.stdout
    return json.loads(result.stderr)["error"]


def make_repo(root: Path, name: str = "tree") -> Path:
    """`git init` with `origin` pointing at a local bare-repository path."""
    tree = root / name
    tree.mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=tree, check=True)
    remote = root / f"{name}-remote.git"
    subprocess.run(["git", "remote", "add", "origin", str(remote)], cwd=tree, check=True)
    return tree


def new_user(platform, name: str) -> tuple[dict, dict[str, str]]:
    """A user created by the admin, and an environment that acts as them."""
    created = osmosis_json(
        "admin", "user", "create", name, "--email", f"{name}@example.com", env=platform.env
    )
    env = clean_env(**{**platform.env, "OSMOSIS_TOKEN": created["resource"]["token"]})
    return created["resource"], env


def headers(token: str, git: str | None = None) -> dict[str, str]:
    result = {"Authorization": f"Bearer {token}"}
    if git is not None:
        result["X-Osmosis-Git"] = git
    return result


def test_the_first_use_creates_the_workspace_with_its_user_as_owner(running_platform, tmp_path):
    tree = make_repo(tmp_path)
    info = cli_json("workspace", "info", env=running_platform.env, cwd=tree)["data"]
    identity = f"file://{(tmp_path / 'tree-remote').resolve()}"
    assert info["identity"] == identity == info["git"]["identity"]
    assert info["role"] == "owner" and info["created_by"] == "admin"
    assert [m["name"] for m in info["members"]] == ["admin"]
    assert info["workspace_directory"] == str(tree.resolve())
    again = cli_json("workspace", "info", env=running_platform.env, cwd=tree)["data"]
    assert again["id"] == info["id"]
    shown = cli("workspace", "info", env={**running_platform.env, "COLUMNS": "80"}, cwd=tree)
    assert "admin (owner)" in shown.stdout and '"user_id"' not in shown.stdout


def test_outsiders_get_the_same_404_as_for_a_workspace_that_does_not_exist(
    running_platform, tmp_path
):
    tree = make_repo(tmp_path)
    owner = cli_json("workspace", "info", env=running_platform.env, cwd=tree)["data"]
    outsider, as_outsider = new_user(running_platform, "outsider")

    error = cli_error("workspace", "info", env=as_outsider, cwd=tree)
    assert error["code"] == "NOT_FOUND"

    token = as_outsider["OSMOSIS_TOKEN"]
    url = running_platform.url
    answers = [
        httpx.delete(f"{url}/api/secrets/X_KEY", headers=headers(token, git))
        for git in (owner["identity"], "nobody/never-created")
    ]
    answers += [
        httpx.post(f"{url}/api/workspace/members", headers=headers(token, git), json=body)
        for git in (owner["identity"], "nobody/never-created")
        for body in ({"user_id": outsider["id"]},)
    ]
    for response in answers:
        assert response.status_code == 404
    messages = {response.json()["error"]["message"] for response in answers}
    assert messages == {error["message"]}
    assert "exist" not in error["message"] and owner["identity"] not in error["message"]


def test_workspace_routes_need_the_git_header(running_platform):
    token = running_platform.admin_token
    for method, path in [
        ("GET", "/api/workspace"),
        ("GET", "/api/secrets"),
        ("DELETE", "/api/secrets/X_KEY"),
    ]:
        response = httpx.request(method, f"{running_platform.url}{path}", headers=headers(token))
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "GIT_SCOPE_HEADER_REQUIRED"


def test_commands_outside_a_repository_or_without_origin_need_a_workspace(
    running_platform, tmp_path
):
    outside = tmp_path / "plain"
    outside.mkdir()
    error = cli_error("workspace", "info", env=running_platform.env, cwd=outside)
    assert error["code"] == "WORKSPACE_REQUIRED"

    subprocess.run(["git", "init", "-q"], cwd=outside, check=True)
    result = cli("secret", "list", env=running_platform.env, cwd=outside)
    assert result.returncode == 1
    assert "origin" in result.stderr and "git remote add origin" in result.stderr
    assert "Traceback" not in result.stderr


# -- one identity per origin ----------------------------------------------------------------
def test_every_spelling_of_an_origin_is_one_workspace(running_platform):
    url, token = running_platform.url, running_platform.admin_token
    spellings = [
        "git.example.com/team/alice",
        "git.example.com/team/alice.git",
        "git.example.com/team/alice/",
        "GIT.Example.COM/team/alice",
        "https://git.example.com:8443/team/alice.git",
    ]
    answers = [httpx.get(f"{url}/api/workspace", headers=headers(token, s)) for s in spellings]
    assert [a.status_code for a in answers] == [200] * len(spellings), answers[0].text
    assert len({a.json()["id"] for a in answers}) == 1
    assert {a.json()["identity"] for a in answers} == {"git.example.com/team/alice"}
    github = [
        httpx.get(f"{url}/api/workspace", headers=headers(token, s)).json()["identity"]
        for s in ("Example-Org/WS", "github.com/example-org/ws.git", "example-org/ws/")
    ]
    assert github == ["example-org/ws"] * 3
    mine = httpx.get(f"{url}/api/workspaces", headers=headers(token)).json()["workspaces"]
    identities = [w["identity"] for w in mine]
    assert identities.count("git.example.com/team/alice") == 1
    assert identities.count("example-org/ws") == 1

    for bad in ("just-a-name", "ext::sh -c touch% /tmp/pwned"):
        refused = httpx.get(f"{url}/api/workspace", headers=headers(token, bad))
        assert refused.status_code == 422, bad
        assert "owner/repo, host/path or file:///path" in refused.json()["error"]["message"]


# -- who creates a workspace ------------------------------------------------------------------
def test_a_user_who_is_not_an_admin_cannot_claim_a_workspace_by_naming_it(
    running_platform, tmp_path
):
    tree = make_repo(tmp_path)
    bea, as_bea = new_user(running_platform, "bea")
    url = running_platform.url

    first_use = cli_error("workspace", "info", env=as_bea, cwd=tree)
    assert first_use["code"] == "NOT_FOUND"
    assert "osmosis workspace create" in first_use["details"]["hint"]
    for command in (["secret", "list"], ["dataset", "list"], ["eval", "list"]):
        assert cli_error(*command, env=as_bea, cwd=tree)["code"] == "NOT_FOUND", command
    explicit = cli_error("workspace", "create", env=as_bea, cwd=tree)
    assert explicit["code"] == "FORBIDDEN" and "OSMOSIS_WORKSPACE_CREATION" in explicit["message"]
    github = httpx.get(f"{url}/api/workspace", headers=headers(bea["token"], "bea-org/evals"))
    assert github.status_code == 404
    # Nothing was created: the admin, who may see it, finds no such workspace.
    admin_sees = cli_json("workspace", "list", env=running_platform.env, cwd=tree)["items"]
    assert not {w["identity"] for w in admin_sees} & {
        f"file://{(tmp_path / 'tree-remote').resolve()}",
        "bea-org/evals",
    }

    created = cli_json(
        "workspace", "create", "--owner", "bea@example.com", env=running_platform.env, cwd=tree
    )
    assert created["operation"] == "workspace.create"
    info = cli_json("workspace", "info", env=as_bea, cwd=tree)["data"]
    assert info["role"] == "owner" and [m["name"] for m in info["members"]] == ["bea"]
    assert cli_error("workspace", "create", env=running_platform.env, cwd=tree)["code"] == (
        "CONFLICT"
    )
    listed = cli_json("workspace", "list", env=as_bea, cwd=tree)["items"]
    assert [w["identity"] for w in listed] == [info["identity"]]


@pytest.fixture(scope="module")
def open_platform(tmp_path_factory, module_databases) -> Iterator[RunningPlatform]:
    """A server where any user creates workspaces, for origins under `<root>/shared` or
    `git.example.com/team/*` only."""
    root = tmp_path_factory.mktemp("open")
    (root / "shared").mkdir()
    env = clean_env(
        OSMOSIS_HOME=str(root / "home"),
        OSMOSIS_CONFIG_DIR=str(root / "config"),
        OSMOSIS_WORKSPACE_CREATION="open",
        OSMOSIS_CLONE_ALLOW=f"{root / 'shared'}, git.example.com/team/*",
        **module_databases.env(root / "home"),
    )
    port = free_port()
    started = osmosis("server", "start", "--detach", "--port", str(port), env=env)
    assert started.returncode == 0, started.stderr + started.stdout
    try:
        yield RunningPlatform(
            url=f"http://127.0.0.1:{port}",
            home=root / "home",
            config_dir=root / "config",
            env=env,
            databases=module_databases,
        )
    finally:
        osmosis("server", "stop", env=env)


def bare_repo_with_a_commit(path: Path) -> Path:
    """A bare repository at `path` holding one pushed commit (someone's real repository)."""
    subprocess.run(["git", "init", "-q", "--bare", str(path)], check=True)
    work = path.with_name(path.name + ".work")
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    (work / "SECRET.txt").write_text("alice's private notes\n")
    for args in (
        ["add", "-A"],
        ["commit", "-qm", "private"],
        ["push", "-q", str(path), "HEAD:main"],
    ):
        subprocess.run(
            ["git", "-c", "user.name=A", "-c", "user.email=a@example.com", *args],
            cwd=work,
            check=True,
        )
    return path


def test_in_open_mode_nobody_claims_an_origin_the_server_may_not_clone(open_platform, tmp_path):
    private = bare_repo_with_a_commit(tmp_path / "alice" / "private.git")
    bea, _ = new_user(open_platform, "bea")
    url, token = open_platform.url, bea["token"]
    claimed = f"file://{private.resolve()}"

    refused = httpx.get(f"{url}/api/workspace", headers=headers(token, claimed))
    assert refused.status_code == 403, refused.text
    error = refused.json()["error"]
    assert error["code"] == "ORIGIN_NOT_ALLOWED" and "OSMOSIS_CLONE_ALLOW" in error["message"]
    submitted = httpx.post(
        f"{url}/api/eval-runs",
        headers=headers(token, claimed),
        json={"repository": {"origin_url": str(private), "commit_sha": "a" * 40}},
    )
    assert submitted.status_code == 403
    # Refused before any clone: the server holds no copy of alice's repository.
    mirrors = open_platform.home / "git"
    assert not mirrors.exists() or not any(mirrors.rglob("HEAD"))
    # The admin is bound by the list too; other hosts and paths are refused alike.
    for who, identity in [
        (open_platform.admin_token, claimed),
        (token, "git.example.com/other/repo"),
        (token, "github.com/alice/private"),
    ]:
        answer = httpx.get(f"{url}/api/workspace", headers=headers(who, identity))
        assert answer.status_code == 403, (identity, answer.text)

    shared = open_platform.home.parent / "shared"
    allowed = [
        httpx.get(f"{url}/api/workspace", headers=headers(token, identity))
        for identity in ("git.example.com/team/bea", f"file://{shared / 'bea'}")
    ]
    assert [answer.status_code for answer in allowed] == [200, 200], allowed[1].text
    assert {answer.json()["role"] for answer in allowed} == {"owner"}


def test_a_run_whose_origin_the_allowlist_no_longer_admits_fails_before_git_touches_it(
    tmp_path, databases
):
    from osmosis.testing import FakeModelServer
    from tests.e2e.workspace import row
    from tests.platform.eval_world import Server, finished, submit, upload_dataset
    from tests.platform.eval_world import make_repo as make_pushed_repo

    with FakeModelServer() as model:
        repos = tmp_path / "repos"
        server = Server.start(
            tmp_path / "platform", model, databases=databases, OSMOSIS_CLONE_ALLOW=str(repos)
        )
        try:
            repo = make_pushed_repo(repos, [row("pass", a, 3) for a in range(2, 6)], limit=4)
            upload_dataset(server, repo)  # the admin's first use: allowed, under the root
            server.stop()
            server.env["OSMOSIS_CLONE_ALLOW"] = "git.example.com/**"  # the operator tightens it
            server.launch()
            with server.client() as client:
                detail = finished(client, submit(client, repo).id)
            assert detail.eval_run.status == "failed"
            assert detail.eval_run.error is not None
            assert "under no local root of OSMOSIS_CLONE_ALLOW" in detail.eval_run.error
            mirrors = server.home / "git"
            assert not mirrors.exists() or not any(mirrors.rglob("HEAD"))
        finally:
            server.stop()


# -- the migration of existing homes ---------------------------------------------------------
def test_the_migration_normalises_identities_and_quarantines_duplicates(tmp_path, caplog):
    from sqlalchemy import text

    from osmosis.platform.core.db import make_engine
    from osmosis.platform.core.db.migrate import upgrade
    from osmosis.workspace import canonical_identity

    engine = make_engine(f"sqlite:///{tmp_path / 'platform.db'}")
    upgrade(engine, "0005")
    rows = [  # id, identity as stored before 0006, created_at, creator
        ("w-squat", "Alice/Repo.git", "2026-01-01", "bea"),  # a hand-made header, first
        ("w-alice", "alice/repo", "2026-01-02", "alice"),  # what the CLI sent
        ("w-other", "GIT.example.com/team/x/", "2026-01-03", "alice"),
        ("w-junk", "x", "2026-01-04", "bea"),
    ]
    with engine.begin() as db:
        for name in ("alice", "bea"):
            db.execute(
                text("INSERT INTO users (id, name, is_admin, created_at) VALUES (:n, :n, 0, :t)"),
                {"n": name, "t": "2026-01-01"},
            )
        for row_id, identity, created, creator in rows:
            db.execute(
                text(
                    "INSERT INTO workspaces (id, identity, created_by, created_at) "
                    "VALUES (:i, :w, :c, :t)"
                ),
                {"i": row_id, "w": identity, "c": creator, "t": created},
            )
            db.execute(
                text(
                    "INSERT INTO workspace_members (workspace_id, user_id, role, created_at) "
                    "VALUES (:i, :c, 'owner', :t)"
                ),
                {"i": row_id, "c": creator, "t": created},
            )
    with caplog.at_level("INFO", logger="osmosis.platform"):
        upgrade(engine)
    with engine.connect() as db:
        after = dict(db.execute(text("SELECT id, identity FROM workspaces")).all())
        members = db.execute(text("SELECT count(*) FROM workspace_members")).scalar_one()
        columns = {
            table: {c[1] for c in db.execute(text(f"PRAGMA table_info({table})"))}
            for table in ("users", "api_tokens")
        }
    engine.dispose()
    assert after["w-alice"] == "alice/repo"  # the normalised row keeps it, though not first
    assert after["w-other"] == "git.example.com/team/x"
    assert after["w-squat"].startswith("quarantined:") and after["w-squat"].endswith(
        "Alice/Repo.git"
    )
    assert after["w-junk"].startswith("quarantined:")
    assert members == 4  # nothing merged, nothing deleted
    for quarantined in (after["w-squat"], after["w-junk"]):
        assert canonical_identity(quarantined) != quarantined  # no request reaches it
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    squat = next(m for m in warnings if "w-squat" in m)
    assert "w-alice" in squat and "nothing was merged" in squat and "1 members" in squat
    assert any("w-junk" in m and "names no repository" in m for m in warnings)
    assert "deactivated_at" in columns["users"] and "expires_at" in columns["api_tokens"]


# -- the clone allowlist's own rules (in process) -------------------------------------------
@pytest.mark.parametrize(
    ("allow", "identity", "by_admin", "allowed"),
    [
        ("github.com/acme/*", "acme/evals", False, True),
        ("github.com/Acme/*", "acme/evals", False, True),  # GitHub's names have no case
        ("github.com/acme/*", "acme/evals/deeper", False, False),
        ("github.com/acme/*", "other/evals", False, False),
        ("git.example.com/team/**", "git.example.com/team/a/b", False, True),
        ("git.example.com/team/**", "git.example.com/Team/a", False, False),  # path case kept
        ("**", "git.example.com/any/thing", False, True),
        ("/srv/git", "file:///srv/git/ws", False, True),
        ("/srv/git", "file:///srv/gitx/ws", False, False),
        ("/srv/git", "file:///srv/other", True, False),  # a set list binds admins too
        ("github.com/acme/*", "file:///srv/git/ws", True, False),
        (None, "acme/evals", False, True),  # unset: any remote
        (None, "file:///nonexistent/ws", False, False),  # ... local paths only for admins
        (None, "file:///nonexistent/ws", True, True),
    ],
)
def test_what_the_clone_allowlist_admits(allow, identity, by_admin, allowed):
    from osmosis.platform.services.origins import origin_problem, parse_clone_allow

    problem = origin_problem(parse_clone_allow(allow), identity, by_admin=by_admin)
    assert (problem is None) == allowed, problem


def test_a_bad_clone_allowlist_stops_the_server_naming_every_bad_entry(tmp_path):
    from osmosis.platform.core.settings import Settings, SettingsError

    with pytest.raises(SettingsError) as bad:
        Settings.from_env({"OSMOSIS_CLONE_ALLOW": "github.com/acme/*, *, ./relative, /ok"})
    message = str(bad.value)
    assert message.startswith("OSMOSIS_CLONE_ALLOW")
    assert "'*'" in message and "'./relative'" in message
    assert "'github.com/acme/*'" not in message and "'/ok'" not in message  # only bad ones
    started = osmosis(
        "server",
        "start",
        "--detach",
        env=clean_env(OSMOSIS_HOME=str(tmp_path / "h"), OSMOSIS_CLONE_ALLOW="*"),
    )
    assert started.returncode != 0 and "OSMOSIS_CLONE_ALLOW" in started.stderr


# -- doctor: local only, no platform (the layout checks: tests/platform/test_scaffold.py) -----
def test_doctor_outside_a_repository_is_workspace_required(tmp_path):
    error = cli_error("doctor", "--fix", env=clean_env(), cwd=tmp_path)
    assert error["code"] == "WORKSPACE_REQUIRED"
    assert list(tmp_path.iterdir()) == []


def test_only_an_admin_widens_a_workspaces_sandbox_network(running_platform, tmp_path):
    tree = make_repo(tmp_path)
    _, as_nell = new_user(
        running_platform, "nell"
    )  # the module shares one platform: a name of its own
    cli_json(
        "workspace", "create", "--owner", "nell@example.com", env=running_platform.env, cwd=tree
    )
    assert cli_json("workspace", "info", env=as_nell, cwd=tree)["data"]["sandbox_network"] == (
        "default"
    )
    # An owner is not enough: the setting widens what every member's code reaches.
    refused = cli_error("workspace", "set", "--sandbox-network", "full", env=as_nell, cwd=tree)
    assert refused["code"] == "FORBIDDEN" and "admin" in refused["message"]
    bad = cli_error(
        "workspace", "set", "--sandbox-network", "internet", env=running_platform.env, cwd=tree
    )
    assert bad["code"] == "VALIDATION" and "bridge, full or default" in bad["message"]

    done = cli_json(
        "workspace", "set", "--sandbox-network", "full", env=running_platform.env, cwd=tree
    )
    assert done["resource"]["sandbox_network"] == "full"
    assert cli_json("workspace", "info", env=as_nell, cwd=tree)["data"]["sandbox_network"] == "full"
    back = cli_json(
        "workspace", "set", "--sandbox-network", "default", env=running_platform.env, cwd=tree
    )
    assert back["resource"]["sandbox_network"] is None
