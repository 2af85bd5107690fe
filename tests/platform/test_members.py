"""Workspace members with roles: owners add, remove and re-role members; members use the
workspace and may leave it; the last active owner stays; nobody but an owner learns whether an
address is registered. A real server process, real git repositories, driven through the CLI
and over HTTP."""

from __future__ import annotations

import httpx
import pytest

from tests.platform.test_workspaces import cli, cli_error, cli_json, headers, make_repo, new_user

pytestmark = pytest.mark.slow


def names_and_roles(listing: dict) -> dict[str, str]:
    return {item["name"]: item["role"] for item in listing["items"]}


def test_only_owners_add_members_and_nobody_else_learns_whether_an_address_is_registered(
    running_platform, tmp_path
):
    admin = running_platform.env
    tree = make_repo(tmp_path)
    identity = cli_json("workspace", "info", env=admin, cwd=tree)["data"]["identity"]
    _, as_bea = new_user(running_platform, "bea")
    new_user(running_platform, "cleo")  # registered, never added by bea
    _, as_dan = new_user(running_platform, "dan")
    cli_json("workspace", "member", "add", "bea@example.com", env=admin, cwd=tree)

    # A member who is not an owner: the same refusal for a registered and an unknown address.
    registered = cli_error("workspace", "member", "add", "cleo@example.com", env=as_bea, cwd=tree)
    unknown = cli_error("workspace", "member", "add", "nobody@example.com", env=as_bea, cwd=tree)
    assert registered["code"] == "NOT_OWNER" and "admin" in registered["message"]
    assert registered == unknown
    url = running_platform.url
    for token, status in [(as_bea["OSMOSIS_TOKEN"], 403), (as_dan["OSMOSIS_TOKEN"], 404)]:
        answers = [
            httpx.post(f"{url}/api/workspace/members", headers=headers(token, identity), json=body)
            for body in ({"email": "cleo@example.com"}, {"email": "nobody@example.com"})
        ]
        assert {a.status_code for a in answers} == {status}
        assert answers[0].content == answers[1].content  # byte for byte
    assert names_and_roles(cli_json("workspace", "member", "list", env=admin, cwd=tree)) == {
        "admin": "owner",
        "bea": "member",
    }

    # An owner is told, so that an add can say what happened.
    missing = cli_error("workspace", "member", "add", "nobody@example.com", env=admin, cwd=tree)
    assert missing["code"] == "NOT_FOUND" and "nobody@example.com" in missing["message"]
    cli_json(
        "workspace", "member", "add", "cleo@example.com", "--role", "owner", env=admin, cwd=tree
    )
    as_cleo = {**as_dan, "OSMOSIS_TOKEN": _token_of(running_platform, "cleo")}
    added = cli_json("workspace", "member", "add", "dan@example.com", env=as_cleo, cwd=tree)
    assert {m["name"]: m["role"] for m in added["resource"]["members"]} == {
        "admin": "owner",
        "bea": "member",
        "cleo": "owner",
        "dan": "member",
    }
    twice = cli_error("workspace", "member", "add", "dan@example.com", env=as_cleo, cwd=tree)
    assert twice["code"] == "CONFLICT"


def _token_of(platform, name: str) -> str:
    """A fresh token for user `name`, issued by the admin."""
    users = cli_json("admin", "user", "list", env=platform.env, cwd=platform.home)["items"]
    user_id = next(u["id"] for u in users if u["name"] == name)
    issued = cli_json("admin", "token", "create", user_id, env=platform.env, cwd=platform.home)
    return str(issued["resource"]["token"])


def test_owners_remove_and_re_role_members_members_leave_and_the_last_owner_stays(
    running_platform, tmp_path
):
    admin = running_platform.env
    tree = make_repo(tmp_path)
    cli_json("workspace", "info", env=admin, cwd=tree)
    _, as_erin = new_user(running_platform, "erin")
    _, as_fay = new_user(running_platform, "fay")
    for email in ("erin@example.com", "fay@example.com"):
        cli_json("workspace", "member", "add", email, env=admin, cwd=tree)

    for command in (["remove", "fay", "-y"], ["set-role", "fay", "owner"]):
        refused = cli_error("workspace", "member", *command, env=as_erin, cwd=tree)
        assert refused["code"] == "NOT_OWNER", command
    unconfirmed = cli_error("workspace", "member", "remove", "fay", env=admin, cwd=tree)
    assert unconfirmed["code"] == "INTERACTIVE_REQUIRED"

    member = ["workspace", "member"]
    removed = cli_json(*member, "remove", "fay@example.com", "-y", env=admin, cwd=tree)
    assert removed["resource"]["member"]["name"] == "fay"
    assert cli_error("workspace", "info", env=as_fay, cwd=tree)["code"] == "NOT_FOUND"
    gone = cli_error("workspace", "member", "remove", "fay", "-y", env=admin, cwd=tree)
    assert gone["code"] == "NOT_FOUND" and "not a member" in gone["message"]

    left = cli_json("workspace", "member", "remove", "erin", "-y", env=as_erin, cwd=tree)
    assert left["operation"] == "workspace.member.remove"  # a member may leave
    assert cli_error("workspace", "info", env=as_erin, cwd=tree)["code"] == "NOT_FOUND"

    # The one owner can neither go nor step down, not even by an admin's hand.
    for command in (["remove", "admin", "-y"], ["set-role", "admin", "member"]):
        last = cli_error("workspace", "member", *command, env=admin, cwd=tree)
        assert last["code"] == "CONFLICT" and "last active owner" in last["message"], command
    cli_json("workspace", "member", "add", "erin@example.com", env=admin, cwd=tree)
    cli_json("workspace", "member", "set-role", "erin", "owner", env=admin, cwd=tree)
    stepped_down = cli_json(*member, "set-role", "admin", "member", env=as_erin, cwd=tree)
    listing = cli_json("workspace", "member", "list", env=as_erin, cwd=tree)
    assert names_and_roles(listing) == {"admin": "member", "erin": "owner"}
    assert stepped_down["operation"] == "workspace.member.set-role"
    table = cli("workspace", "member", "list", env={**as_erin, "COLUMNS": "120"}, cwd=tree)
    assert "erin" in table.stdout and "owner" in table.stdout


def test_an_admin_manages_the_members_of_a_workspace_they_are_not_in(running_platform, tmp_path):
    admin = running_platform.env
    tree = make_repo(tmp_path)
    _, as_hal = new_user(running_platform, "hal")
    new_user(running_platform, "ian")
    cli_json("workspace", "create", "--owner", "hal@example.com", env=admin, cwd=tree)

    added = cli_json("workspace", "member", "add", "ian@example.com", env=admin, cwd=tree)
    assert {m["name"] for m in added["resource"]["members"]} == {"hal", "ian"}  # not admin
    info = cli_json("workspace", "info", env=as_hal, cwd=tree)["data"]
    assert info["role"] == "owner" and "admin" not in {m["name"] for m in info["members"]}
