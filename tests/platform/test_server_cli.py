"""Acceptance: a real `osmosis server` process, driven through the CLI and over HTTP."""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path

import httpx
import pytest

from tests.platform.conftest import clean_env, free_port, osmosis, osmosis_json

pytestmark = pytest.mark.slow


def process_exists(pid: int) -> bool:
    """Alive and not a zombie (the detached server is reaped by init, not by us)."""
    try:
        os.kill(pid, 0)
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (ProcessLookupError, FileNotFoundError):
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def test_status_reports_the_running_server(running_platform):
    status = osmosis_json("server", "status", env=running_platform.env)["data"]
    assert status["running"] is True
    assert status["url"] == running_platform.url
    assert status["home"] == str(running_platform.home)
    assert isinstance(status["pid"], int)
    assert (running_platform.home / "server.pid").read_text().strip() == str(status["pid"])
    assert status["low_disk"] is False and status["disk_free_bytes"] > 0


def test_first_start_leaves_owner_only_credentials_and_the_cli_needs_no_login(running_platform):
    credentials = running_platform.home / "credentials.json"
    assert credentials.stat().st_mode & 0o777 == 0o600
    assert json.loads(credentials.read_text())["platform_url"] == running_platform.url

    whoami = osmosis_json("auth", "whoami", env=running_platform.env)["data"]
    assert whoami["user"] == "admin" and whoami["is_admin"] is True
    assert whoami["platform_url"] == running_platform.url
    assert whoami["token_source"] == str(credentials)


def test_the_token_is_never_logged(running_platform):
    log = (running_platform.home / "server.log").read_text()
    assert running_platform.admin_token not in log


def test_every_route_but_health_needs_a_token(running_platform):
    document = httpx.get(f"{running_platform.url}/openapi.json").json()
    checked = []
    for path, operations in document["paths"].items():
        concrete = re.sub(r"\{[^}]+\}", "x", path)
        for method in operations:
            for headers in ({}, {"Authorization": "Bearer osm_wrong"}):
                response = httpx.request(
                    method, f"{running_platform.url}{concrete}", headers=headers, json={}
                )
                if path == "/api/health":
                    assert response.status_code == 200
                    continue
                assert response.status_code == 401, (method, path, response.text)
                assert response.json()["error"]["code"] == "AUTH_REQUIRED"
                checked.append((method, path))
    assert len(checked) >= 2 * 4  # whoami, list users, create user, create token


def test_admin_creates_a_user_whose_token_works_and_is_not_admin(running_platform):
    env = running_platform.env
    created = osmosis_json("admin", "user", "create", "ada", "--email", "ada@example.com", env=env)
    token = created["resource"]["token"]
    assert created["operation"] == "admin.user.create" and token.startswith("osm_")

    as_ada = clean_env(**{**env, "OSMOSIS_TOKEN": token})
    whoami = osmosis_json("auth", "whoami", env=as_ada)["data"]
    assert (whoami["user"], whoami["is_admin"], whoami["token_source"]) == (
        "ada",
        False,
        "OSMOSIS_TOKEN",
    )

    denied = osmosis("--json", "admin", "user", "list", env=as_ada)
    assert denied.returncode == 1 and denied.stdout == ""
    error = json.loads(denied.stderr)
    assert error["error"]["code"] == "FORBIDDEN"
    assert error["schema_version"] == 1 and error["command"].startswith("admin user list")

    listed = osmosis_json("admin", "user", "list", env=env)
    assert {"admin", "ada"} <= {item["name"] for item in listed["items"]}
    assert listed["total_count"] >= 2

    # The database holds the token's digest, never the token itself.
    stored = running_platform.databases.stored_bytes(running_platform.database_url)
    assert token.encode() not in stored
    assert running_platform.admin_token.encode() not in stored
    import hashlib

    assert hashlib.sha256(token.encode()).hexdigest().encode() in stored


def test_admin_issues_another_token(running_platform):
    env = running_platform.env
    user = osmosis_json("admin", "user", "create", "cy", "--email", "cy@example.com", env=env)
    issued = osmosis_json(
        "admin", "token", "create", user["resource"]["id"], "--name", "ci", env=env
    )
    headers = {"Authorization": f"Bearer {issued['resource']['token']}"}
    whoami = httpx.get(f"{running_platform.url}/api/auth/whoami", headers=headers).json()
    assert (whoami["user"]["name"], whoami["token"]["name"]) == ("cy", "ci")


def test_bad_token_is_auth_required_with_a_hint(running_platform):
    env = clean_env(**{**running_platform.env, "OSMOSIS_TOKEN": "osm_wrong"})
    result = osmosis("auth", "whoami", env=env)
    assert result.returncode == 1
    # Logging in again would not help while OSMOSIS_TOKEN wins: the hint says so.
    assert "not valid" in result.stderr and "OSMOSIS_TOKEN holds a token" in result.stderr
    as_json = json.loads(osmosis("auth", "whoami", "--json", env=env).stderr)
    assert as_json["error"]["code"] == "AUTH_REQUIRED"
    assert as_json["error"]["details"]["token_source"] == "OSMOSIS_TOKEN"


def test_a_saved_login_whose_token_died_names_the_file_and_how_to_log_in(
    running_platform, tmp_path
):
    config = tmp_path / "cfg"
    config.mkdir()
    saved = {"token": "osm_revoked", "user": "ada"}
    logins = {"current": running_platform.url, "platforms": {running_platform.url: saved}}
    (config / "credentials.json").write_text(json.dumps(logins))
    env = clean_env(OSMOSIS_CONFIG_DIR=str(config), OSMOSIS_HOME=str(tmp_path / "none"))
    result = osmosis("auth", "whoami", env=env)
    assert result.returncode == 1
    assert "was rejected" in result.stderr and "osmosis auth login" in result.stderr
    error = json.loads(osmosis("--json", "auth", "whoami", env=env).stderr)["error"]
    assert error["details"]["token_source"] == str(config / "credentials.json")


def test_login_saves_an_owner_only_token_and_logout_forgets_it(running_platform, tmp_path):
    # No OSMOSIS_HOME: the embedded credentials are out of reach, only the login counts.
    env = clean_env(OSMOSIS_CONFIG_DIR=str(tmp_path / "cfg"), OSMOSIS_HOME=str(tmp_path / "none"))
    not_yet = json.loads(osmosis("--json", "auth", "whoami", env=env).stderr)
    assert not_yet["error"]["code"] == "AUTH_REQUIRED"

    login = osmosis_json(
        "auth",
        "login",
        "--token",
        running_platform.admin_token,
        "--platform",
        running_platform.url,
        env=env,
    )
    assert login["resource"]["user"] == "admin"
    saved = tmp_path / "cfg" / "credentials.json"
    assert saved.stat().st_mode & 0o777 == 0o600
    assert osmosis_json("auth", "whoami", env=env)["data"]["token_source"] == str(saved)

    osmosis_json("auth", "logout", env=env)
    assert json.loads(saved.read_text())["platforms"] == {}
    again = osmosis("--json", "auth", "whoami", "--platform", running_platform.url, env=env)
    assert json.loads(again.stderr)["error"]["code"] == "AUTH_REQUIRED"


def test_a_revoked_token_is_refused_at_once_and_logout_can_revoke(running_platform, tmp_path):
    env = running_platform.env
    created = osmosis_json("admin", "user", "create", "rev", env=env)["resource"]
    as_rev = clean_env(**{**env, "OSMOSIS_TOKEN": created["token"]})
    assert osmosis_json("auth", "whoami", env=as_rev)["data"]["user"] == "rev"

    tokens = osmosis_json("admin", "token", "list", created["id"], env=env)["items"]
    assert [(t["name"], t["revoked_at"]) for t in tokens] == [("default", None)]
    assert "token" not in tokens[0]  # metadata only, never the secret
    unconfirmed = json.loads(
        osmosis("--json", "admin", "token", "revoke", tokens[0]["id"], env=env).stderr
    )["error"]
    assert unconfirmed["code"] == "INTERACTIVE_REQUIRED"
    revoked = osmosis_json("admin", "token", "revoke", tokens[0]["id"], "-y", env=env)
    assert revoked["resource"]["revoked_at"] is not None
    refused = osmosis("--json", "auth", "whoami", env=as_rev)
    assert json.loads(refused.stderr)["error"]["code"] == "AUTH_REQUIRED"

    # logout --revoke: the saved token is refused by the platform, not only forgotten.
    issued = osmosis_json("admin", "token", "create", created["id"], "--name", "laptop", env=env)
    secret = issued["resource"]["token"]
    mine = clean_env(OSMOSIS_CONFIG_DIR=str(tmp_path / "cfg"), OSMOSIS_HOME=str(tmp_path / "no"))
    osmosis_json("auth", "login", "--token", secret, "--platform", running_platform.url, env=mine)
    out = osmosis_json("auth", "logout", "--revoke", env=mine)
    assert out["resource"] == {**out["resource"], "removed": True, "revoked": True}
    headers = {"Authorization": f"Bearer {secret}"}
    assert httpx.get(f"{running_platform.url}/api/auth/whoami", headers=headers).status_code == 401


def test_bad_user_input_names_each_field_and_rule_without_a_traceback(running_platform):
    env = running_platform.env
    bad = osmosis("admin", "user", "create", "bad name", "--email", "nope", env=env)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    error = json.loads(
        osmosis("--json", "admin", "user", "create", "bad name", "--email", "nope", env=env).stderr
    )["error"]
    assert error["code"] == "VALIDATION"
    name_problem, email_problem = error["details"]["problems"]
    assert "'bad name'" in name_problem and "starts with a letter or digit" in name_problem
    assert email_problem.startswith("email")
    token = json.loads(
        osmosis("--json", "admin", "token", "create", "u1", "--name", "a b", env=env).stderr
    )
    assert token["error"]["code"] == "VALIDATION"

    osmosis_json("admin", "user", "create", "dup", env=env)
    taken = json.loads(osmosis("--json", "admin", "user", "create", "dup", env=env).stderr)
    assert taken["error"]["code"] == "CONFLICT" and "'dup'" in taken["error"]["message"]


def test_the_last_live_admin_token_cannot_be_revoked(local_platform):
    from osmosis.platform.core.db.models import ApiToken
    from osmosis.platform.core.errors import Conflict
    from osmosis.platform.services import users

    with local_platform.app.state.sessions() as db:
        (only,) = db.query(ApiToken).all()
        with pytest.raises(Conflict, match="last live admin token"):
            users.revoke_token(db, token_id=only.id)


def test_login_with_a_bad_token_saves_nothing(running_platform, tmp_path):
    env = clean_env(OSMOSIS_CONFIG_DIR=str(tmp_path / "cfg"))
    result = osmosis(
        "--json",
        "auth",
        "login",
        "--token",
        "osm_wrong",
        "--platform",
        running_platform.url,
        env=env,
    )
    assert result.returncode == 1
    assert json.loads(result.stderr)["error"]["code"] == "AUTH_REQUIRED"
    assert not (tmp_path / "cfg" / "credentials.json").exists()


@pytest.mark.parametrize("args", [("auth", "whoami"), ("auth", "login", "--token", "osm_x")])
def test_plain_http_to_a_non_loopback_platform_is_refused(args, tmp_path):
    env = clean_env(OSMOSIS_CONFIG_DIR=str(tmp_path), OSMOSIS_TOKEN="osm_x")
    result = osmosis("--json", *args, "--platform", "http://192.0.2.1:8765", env=env)
    assert result.returncode == 1
    error = json.loads(result.stderr)["error"]
    assert error["code"] == "VALIDATION" and "plain http" in error["message"]


def test_an_unreachable_platform_is_a_network_error(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    env = clean_env(OSMOSIS_CONFIG_DIR=str(tmp_path), OSMOSIS_TOKEN="osm_x")
    error = json.loads(osmosis("--json", "auth", "whoami", "--platform", url, env=env).stderr)
    assert error["error"]["code"] == "NETWORK" and url in error["error"]["message"]


def test_platform_before_the_command_wins_over_the_environment(running_platform, tmp_path):
    unreachable = f"http://127.0.0.1:{free_port()}"
    env = clean_env(
        OSMOSIS_CONFIG_DIR=str(tmp_path),
        OSMOSIS_PLATFORM_URL=unreachable,
        OSMOSIS_TOKEN=running_platform.admin_token,
    )
    assert json.loads(osmosis("--json", "auth", "whoami", env=env).stderr)["error"]["code"] == (
        "NETWORK"
    )
    whoami = osmosis_json("--platform", running_platform.url, "auth", "whoami", env=env)
    assert whoami["data"]["platform_url"] == running_platform.url
    assert whoami["data"]["user"] == "admin"


def test_a_second_start_on_the_same_home_is_refused(running_platform):
    result = osmosis(
        "--json",
        "server",
        "start",
        "--detach",
        "--port",
        str(free_port()),
        env=running_platform.env,
    )
    assert result.returncode == 1
    assert json.loads(result.stderr)["error"]["code"] == "CONFLICT"


@pytest.mark.parametrize("detach", [True, False], ids=["detached", "foreground"])
def test_a_port_another_socket_holds_is_a_conflict_naming_it(tmp_path, detach):
    # Bound but not listening: a connection is refused, yet no server could bind it.
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
        env = clean_env(OSMOSIS_HOME=str(tmp_path / "home"), OSMOSIS_CONFIG_DIR=str(tmp_path))
        flags = ["--detach"] if detach else []
        result = osmosis("--json", "server", "start", *flags, "--port", str(port), env=env)
    assert result.returncode == 1, result.stderr
    error = json.loads(result.stderr)["error"]
    assert error["code"] == "CONFLICT"
    assert error["message"] == f"port {port} on 127.0.0.1 is already in use"
    assert error["details"] == {"host": "127.0.0.1", "port": port}
    assert not (tmp_path / "home" / "server.pid").exists()


def test_a_host_not_of_this_machine_is_a_validation_error_not_a_crash(tmp_path):
    env = clean_env(OSMOSIS_HOME=str(tmp_path / "home"), OSMOSIS_ALLOW_INSECURE_HTTP="1")
    port = free_port()
    # 192.0.2.1 is TEST-NET-1 (RFC 5737): an address no machine has.
    result = osmosis(
        "--json", "server", "start", "--host", "192.0.2.1", "--port", str(port), env=env
    )
    assert result.returncode == 1, result.stderr
    error = json.loads(result.stderr)["error"]
    assert error["code"] == "VALIDATION"
    assert error["message"].startswith(f"cannot listen on 192.0.2.1 port {port}: ")
    assert not (tmp_path / "home" / "platform.db").exists()


def test_a_server_whose_port_is_taken_stops_before_it_touches_the_database(tmp_path):
    """The port taken after `server start` checked it: the server's own bind says so."""
    from osmosis.listen import PortInUse
    from osmosis.platform import Settings, serve

    home = tmp_path / "home"
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
        settings = Settings.from_env({"OSMOSIS_HOME": str(home)}, port=port)
        with pytest.raises(PortInUse) as caught:
            serve(settings)
    assert str(caught.value) == f"port {port} on 127.0.0.1 is already in use"
    assert sorted(path.name for path in home.iterdir()) == ["server.lock", "worker.lock"]


def test_serving_plain_http_publicly_needs_the_explicit_flag(tmp_path):
    env = clean_env(OSMOSIS_HOME=str(tmp_path))
    result = osmosis("--json", "server", "start", "--host", "0.0.0.0", env=env)
    assert result.returncode == 1
    assert json.loads(result.stderr)["error"]["code"] == "VALIDATION"


def test_start_stop_status_lifecycle(tmp_path, databases):
    home = tmp_path / "home"
    env = clean_env(
        OSMOSIS_HOME=str(home), OSMOSIS_CONFIG_DIR=str(tmp_path / "c"), **databases.env(home)
    )
    port = free_port()
    started = osmosis_json("server", "start", "--detach", "--port", str(port), env=env)
    pid = started["resource"]["pid"]
    assert started["resource"]["url"] == f"http://127.0.0.1:{port}"
    assert httpx.get(f"http://127.0.0.1:{port}/api/health").status_code == 200

    stopped = osmosis_json("server", "stop", env=env)
    assert stopped["message"] == f"Stopped the server (pid {pid})."
    assert not process_exists(pid)
    assert not (tmp_path / "home" / "server.pid").exists()
    status = osmosis_json("server", "status", env=env)["data"]
    assert (status["running"], status["pid"]) == (False, None)
    assert "No server is running" in osmosis_json("server", "stop", env=env)["message"]

    # A second start reuses the database and the admin, and refreshes the URL it recorded.
    token = json.loads((tmp_path / "home" / "credentials.json").read_text())["token"]
    port = free_port()
    osmosis_json("server", "start", "--detach", "--port", str(port), env=env)
    try:
        whoami = osmosis_json("auth", "whoami", env=env)["data"]
        assert whoami["platform_url"] == f"http://127.0.0.1:{port}"
        saved = json.loads((tmp_path / "home" / "credentials.json").read_text())
        assert saved["token"] == token
    finally:
        osmosis("server", "stop", env=env)


def test_a_foreground_server_stops_cleanly_on_sigterm(tmp_path, databases):
    import signal
    import subprocess
    import time

    from tests.platform.conftest import CLI

    home = tmp_path / "home"
    port = free_port()
    env = clean_env(OSMOSIS_HOME=str(home), **databases.env(home))
    server = subprocess.Popen(
        [*CLI, "server", "start", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/api/health").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        assert (home / "server.pid").read_text().strip() == str(server.pid)
        server.send_signal(signal.SIGTERM)
        output, _ = server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert server.returncode == 0, output
    assert not (home / "server.pid").exists() and not (home / "server.json").exists()
    assert json.loads((home / "credentials.json").read_text())["token"] not in output
