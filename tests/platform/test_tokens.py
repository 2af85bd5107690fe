"""API tokens that expire, a list of one's own tokens, and users an admin deactivates: a real
server process, driven through the CLI, over HTTP and through the dashboard's sign-in."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from osmosis.client import PlatformClient
from tests.platform.conftest import CLI
from tests.platform.test_workspaces import cli, cli_error, cli_json, headers, new_user

pytestmark = pytest.mark.slow


def when(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def around(moment: datetime | None, expected: datetime, slack: float = 120) -> bool:
    return moment is not None and abs((moment - expected).total_seconds()) < slack


@contextmanager
def sign_in(url: str, token: str) -> Iterator[httpx.Client]:
    """A browser-like client signed in to the dashboard with `token`."""
    with httpx.Client(base_url=url, headers={"accept": "text/html"}) as browser:
        page = browser.get("/login")
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
        assert csrf is not None, page.text
        answer = browser.post("/login", data={"token": token, "csrf_token": csrf.group(1)})
        assert answer.status_code == 303, answer.text
        yield browser


def signed_in(browser: httpx.Client) -> bool:
    answer = browser.get("/")
    assert answer.status_code in (200, 303), answer.text
    return answer.status_code == 200


def test_users_list_create_and_revoke_their_own_tokens(running_platform, tmp_path):
    jo, as_jo = new_user(running_platform, "jo")
    now = datetime.now(UTC)

    first = cli_json("auth", "token", "list", env=as_jo, cwd=tmp_path)["items"]
    assert [(t["name"], t["current"]) for t in first] == [("default", True)]
    assert set(first[0]) >= {"id", "name", "created_at", "last_used_at", "expires_at"}
    assert around(when(first[0]["expires_at"]), now + timedelta(days=90))  # the default TTL

    made = cli_json(
        "auth", "token", "create", "--name", "ci", "--expires-in", "30d", env=as_jo, cwd=tmp_path
    )["resource"]
    assert made["token"].startswith("osm_")
    assert around(when(made["expires_at"]), now + timedelta(days=30))
    as_ci = {**as_jo, "OSMOSIS_TOKEN": made["token"]}
    whoami = cli_json("auth", "whoami", env=as_ci, cwd=tmp_path)["data"]
    assert whoami["user"] == "jo" and whoami["token_name"] == "ci"
    assert when(whoami["token_expires_at"]) == when(made["expires_at"])
    listed = cli_json("auth", "token", "list", env=as_jo, cwd=tmp_path)["items"]
    assert [t["name"] for t in listed] == ["default", "ci"]
    assert listed[1]["last_used_at"] is not None  # the whoami above
    table = cli("auth", "token", "list", env={**as_jo, "COLUMNS": "160"}, cwd=tmp_path).stdout
    assert "Expires" in table and "Last Used" in table and made["token"] not in table

    revoked = cli_json("auth", "token", "revoke", made["id"], "-y", env=as_jo, cwd=tmp_path)
    assert revoked["resource"]["revoked_at"] is not None
    assert cli_error("auth", "whoami", env=as_ci, cwd=tmp_path)["code"] == "AUTH_REQUIRED"

    # Another user's token id is as unknown as one that never existed; nothing is revoked.
    admins = cli_json("auth", "token", "list", env=running_platform.env, cwd=tmp_path)["items"]
    for token_id in (admins[0]["id"], "no-such-token"):
        missed = cli_error("auth", "token", "revoke", token_id, "-y", env=as_jo, cwd=tmp_path)
        assert missed["code"] == "NOT_FOUND"
        assert missed["message"] == f"no token with id {token_id!r}"
    assert cli_json("auth", "whoami", env=running_platform.env, cwd=tmp_path)["data"]["user"] == (
        "admin"
    )

    # The first start's admin token never expires: the local CLI needs no step, ever.
    admin = cli_json("auth", "whoami", env=running_platform.env, cwd=tmp_path)["data"]
    assert admin["token_expires_at"] is None
    issued = cli_json(
        "admin",
        "token",
        "create",
        jo["id"],
        "--expires-in",
        "never",
        env=running_platform.env,
        cwd=tmp_path,
    )["resource"]
    assert issued["expires_at"] is None
    bad = cli_error("auth", "token", "create", "--expires-in", "soon", env=as_jo, cwd=tmp_path)
    assert bad["code"] == "VALIDATION" and "30d" in bad["message"]


def test_a_token_and_its_dashboard_session_stop_when_it_expires(running_platform, tmp_path):
    _, as_kai = new_user(running_platform, "kai")
    url = running_platform.url
    with PlatformClient(url, token=as_kai["OSMOSIS_TOKEN"]) as kai:
        short = kai.auth.create_token(name="short", expires_in=5)
        hour = kai.auth.create_token(name="hour", expires_in=3600)
    assert short.expires_at is not None and hour.expires_at is not None
    auth = {"Authorization": f"Bearer {short.token}"}
    assert httpx.get(f"{url}/api/auth/whoami", headers=auth).status_code == 200
    with sign_in(url, short.token) as browser:
        assert signed_in(browser)

        # A short-lived token cannot mint a lasting one: its child expires with it.
        with PlatformClient(url, token=hour.token) as by_hour:
            child = by_hour.auth.create_token(name="child", expires_in="never")
        assert child.expires_at == hour.expires_at

        time.sleep(max(0.0, (short.expires_at - datetime.now(UTC)).total_seconds()) + 0.5)
        expired = httpx.get(f"{url}/api/auth/whoami", headers=auth)
        assert expired.status_code == 401
        assert "expired" in expired.json()["error"]["message"]
        assert not signed_in(browser)  # the session ended with its token
    said = cli("auth", "whoami", env={**as_kai, "OSMOSIS_TOKEN": short.token}, cwd=tmp_path)
    assert said.returncode == 1 and "expired" in said.stderr and "auth token create" in said.stderr


def test_a_deactivated_users_tokens_and_sessions_stop_at_once_and_their_runs_stay(
    running_platform, tmp_path
):
    from tests.e2e.workspace import row
    from tests.platform.eval_world import make_repo as make_pushed_repo
    from tests.platform.eval_world import run_body, upload_dataset

    admin = running_platform.env
    url = running_platform.url
    kim, as_kim = new_user(running_platform, "kim")
    _, as_lee = new_user(running_platform, "lee")
    repo = make_pushed_repo(tmp_path, [row("pass", a, 3) for a in range(2, 6)], limit=4)
    cli_json("workspace", "create", "--owner", "kim@example.com", env=admin, cwd=repo.tree)
    cli_json("workspace", "member", "add", "lee@example.com", env=as_kim, cwd=repo.tree)
    upload_dataset(running_platform, repo, token=as_kim["OSMOSIS_TOKEN"])
    body = run_body(repo)
    body.repository.commit_sha = "ab" * 20  # never pushed: the run fails fast, and stays
    with PlatformClient(url, token=as_kim["OSMOSIS_TOKEN"]) as client:
        run = client.runs.submit(git=repo.git, body=body)
    with sign_in(url, as_kim["OSMOSIS_TOKEN"]) as browser:
        assert signed_in(browser)

        done = cli_json("admin", "user", "deactivate", "kim", "-y", env=admin, cwd=tmp_path)
        assert done["resource"]["sessions_ended"] == 1
        assert done["resource"]["user"]["deactivated_at"] is not None
        assert done["resource"]["workspaces_without_owner"] == [repo.git]
        assert "No active owner left in" in done["message"] and repo.git in done["message"]
        refused = httpx.get(f"{url}/api/auth/whoami", headers=headers(as_kim["OSMOSIS_TOKEN"]))
        assert refused.status_code == 401 and "deactivated" in refused.json()["error"]["message"]
        assert not signed_in(browser)
        again = sign_in_page(url, as_kim["OSMOSIS_TOKEN"])
        assert again.status_code == 401
        no_new = cli_error("admin", "token", "create", kim["id"], env=admin, cwd=tmp_path)
        assert no_new["code"] == "CONFLICT" and "deactivated" in no_new["message"]

        # Her run stays in the workspace, for its other members to see.
        runs = cli_json("eval", "list", env=as_lee, cwd=repo.tree)["items"]
        assert [r["name"] for r in runs] == [run.name]
        members = cli_json("workspace", "member", "list", env=as_lee, cwd=repo.tree)["items"]
        assert {m["name"]: m["active"] for m in members} == {"kim": False, "lee": True}

        itself = cli_error("admin", "user", "deactivate", "admin", "-y", env=admin, cwd=tmp_path)
        assert itself["code"] == "CONFLICT"
        back = cli_json("admin", "user", "reactivate", "kim@example.com", env=admin, cwd=tmp_path)
        assert back["resource"]["deactivated_at"] is None
        kims = headers(as_kim["OSMOSIS_TOKEN"])
        assert httpx.get(f"{url}/api/auth/whoami", headers=kims).status_code == 200
        assert not signed_in(browser)  # a session ended by deactivation stays ended


def sign_in_page(url: str, token: str) -> httpx.Response:
    with httpx.Client(base_url=url, headers={"accept": "text/html"}) as browser:
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', browser.get("/login").text)
        assert csrf is not None
        return browser.post("/login", data={"token": token, "csrf_token": csrf.group(1)})


def test_the_login_page_names_commands_that_exist(running_platform):
    page = httpx.get(f"{running_platform.url}/login").text
    commands = re.findall(r"<code>(osmosis [a-z -]+?)</code>", page)
    assert "osmosis auth token create" in commands
    for command in commands:
        shown = subprocess.run(
            [*CLI, *command.split()[1:], "--help"], capture_output=True, text=True, timeout=60
        )
        assert shown.returncode == 0, (command, shown.stderr)
