"""Secrets: write-only values, encrypted at rest, personal over workspace, members only.

The acceptance tests drive a real server process through the CLI and over HTTP; the store
and key tests run in-process.
"""

from __future__ import annotations

import json
import stat

import httpx
import pytest
from cryptography.fernet import Fernet

from osmosis.platform import Settings, create_app
from osmosis.platform.core.crypto import (
    KEY_ENV,
    SecretBox,
    SecretKeyError,
    SecretUnreadable,
    load_secret_box,
)
from osmosis.platform.core.db.models import Secret
from osmosis.platform.core.errors import NotFound
from osmosis.platform.services.secrets import SecretsNotFound, resolve_secrets, set_secret
from osmosis.platform.services.users import create_user
from osmosis.platform.services.workspaces import add_member, get_or_create
from tests.platform.test_workspaces import cli, cli_error, cli_json, make_repo, new_user

# Distinctive values: grep finds them anywhere they might leak.
PERSONAL_VALUE = "sk-personal-3f9a61c0d2e84b7a"
SHARED_VALUE = "sk-shared-8b1e44f7a09c3d25"
OVERRIDE_VALUE = "sk-override-c7d20e5a11f64b98"
VALUES = (PERSONAL_VALUE, SHARED_VALUE, OVERRIDE_VALUE)


@pytest.fixture(scope="module")
def shared_tree(running_platform, tmp_path_factory):
    """A repository whose workspace the admin owns, with one personal and one shared secret."""
    tree = make_repo(tmp_path_factory.mktemp("secrets"))
    env = {**running_platform.env, "MY_PERSONAL": PERSONAL_VALUE, "MY_SHARED": SHARED_VALUE}
    cli_json("secret", "set", "API_KEY", "--env", "MY_PERSONAL", env=env, cwd=tree)
    cli_json(
        "secret", "set", "API_KEY", "--scope", "workspace", "--env", "MY_SHARED", env=env, cwd=tree
    )
    cli_json("secret", "set", "ADMIN_ONLY", "--env", "MY_PERSONAL", env=env, cwd=tree)
    return tree


def rows(listing: dict) -> set[tuple[str, str]]:
    return {(item["name"], item["scope"]) for item in listing["items"]}


@pytest.mark.slow
def test_set_and_list_show_names_and_scopes_never_values(running_platform, shared_tree):
    env = {**running_platform.env, "V": SHARED_VALUE}
    result = cli(
        "--json",
        "secret",
        "set",
        "OTHER",
        "--scope",
        "workspace",
        "--env",
        "V",
        env=env,
        cwd=shared_tree,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["resource"]["scope"] == "workspace"
    listing = cli_json("secret", "list", env=running_platform.env, cwd=shared_tree)
    assert rows(listing) >= {
        ("API_KEY", "personal"),
        ("API_KEY", "workspace"),
        ("ADMIN_ONLY", "personal"),
        ("OTHER", "workspace"),
    }
    assert listing["items"][0]["updated_by"] == "admin"
    assert listing["git"]["identity"].startswith("file://")
    only_shared = cli_json("secret", "list", "--scope", "workspace", env=env, cwd=shared_tree)
    assert {scope for _, scope in rows(only_shared)} == {"workspace"}
    table = cli("secret", "list", env=running_platform.env, cwd=shared_tree).stdout
    assert "Updated By" in table and "API_KEY" in table
    for text in (result.stdout, result.stderr, json.dumps(listing), table):
        assert not any(value in text for value in VALUES)


@pytest.mark.slow
def test_list_pages_with_limit_and_all(running_platform, tmp_path):
    tree = make_repo(tmp_path)
    env = {**running_platform.env, "V": SHARED_VALUE}
    for name in ("A_KEY", "B_KEY", "C_KEY"):
        cli_json("secret", "set", name, "--env", "V", env=env, cwd=tree)
    first = cli_json("secret", "list", "--limit", "2", env=env, cwd=tree)
    assert [item["name"] for item in first["items"]] == ["A_KEY", "B_KEY"]
    assert (first["total_count"], first["has_more"], first["next_offset"]) == (3, True, 2)
    everything = cli_json("secret", "list", "--all", env=env, cwd=tree)
    assert [item["name"] for item in everything["items"]] == ["A_KEY", "B_KEY", "C_KEY"]
    assert everything["has_more"] is False and everything["next_offset"] is None
    too_many = cli("--json", "secret", "list", "--limit", "51", env=env, cwd=tree)
    assert too_many.returncode == 2 and "--limit" in json.loads(too_many.stderr)["error"]["message"]
    both = cli("--json", "secret", "list", "--all", "--limit", "2", env=env, cwd=tree)
    assert both.returncode == 2 and "--all" in json.loads(both.stderr)["error"]["message"]


@pytest.mark.slow
def test_values_are_never_read_from_argv_or_without_a_terminal(running_platform, shared_tree):
    error = cli_error("secret", "set", "NEW_KEY", env=running_platform.env, cwd=shared_tree)
    assert error["code"] == "INTERACTIVE_REQUIRED" and error["details"]["flags"] == ["--env"]
    unset = cli_error(
        "secret",
        "set",
        "NEW_KEY",
        "--env",
        "NOT_SET_ANYWHERE",
        env=running_platform.env,
        cwd=shared_tree,
    )
    assert unset["code"] == "VALIDATION"
    bad = cli_error(
        "secret", "set", "lower_case", "--env", "HOME", env=running_platform.env, cwd=shared_tree
    )
    assert bad["code"] == "VALIDATION"
    human = cli(
        "secret", "set", "openai-key", "--env", "HOME", env=running_platform.env, cwd=shared_tree
    )
    assert "did you mean OPENAI_KEY?" in human.stderr
    empty = cli_error(
        "secret",
        "set",
        "NEW_KEY",
        "--env",
        "BLANK",
        env={**running_platform.env, "BLANK": ""},
        cwd=shared_tree,
    )
    assert "--env BLANK" in empty["message"] and "empty" in empty["message"]
    usage = cli("secret", "set", "NEW_KEY", "the-value", env=running_platform.env, cwd=shared_tree)
    assert usage.returncode == 2  # no positional value exists


@pytest.mark.slow
def test_delete_confirms_and_hints_at_the_other_scope(running_platform, shared_tree):
    env = {**running_platform.env, "V": SHARED_VALUE}
    cli_json(
        "secret", "set", "TEMP_KEY", "--scope", "workspace", "--env", "V", env=env, cwd=shared_tree
    )

    unconfirmed = cli_error(
        "secret", "delete", "TEMP_KEY", "--scope", "workspace", env=env, cwd=shared_tree
    )
    assert unconfirmed["code"] == "INTERACTIVE_REQUIRED"
    assert unconfirmed["message"] == "Use --yes to confirm in non-interactive mode."

    wrong_scope = cli("secret", "delete", "TEMP_KEY", "-y", env=env, cwd=shared_tree)
    assert wrong_scope.returncode == 1 and "--scope workspace" in wrong_scope.stderr

    url, token = running_platform.url, running_platform.admin_token
    identity = cli_json("workspace", "info", env=env, cwd=shared_tree)["data"]["identity"]
    api_miss = httpx.delete(
        f"{url}/api/secrets/TEMP_KEY",
        params={"scope": "personal"},
        headers={"Authorization": f"Bearer {token}", "X-Osmosis-Git": identity},
    )
    assert api_miss.status_code == 404
    assert api_miss.json()["error"]["details"]["exists_in_scope"] == "workspace"

    deleted = cli_json(
        "secret", "delete", "TEMP_KEY", "--scope", "workspace", "-y", env=env, cwd=shared_tree
    )
    assert deleted["operation"] == "secret.delete"
    assert ("TEMP_KEY", "workspace") not in rows(
        cli_json("secret", "list", env=env, cwd=shared_tree)
    )


@pytest.mark.slow
def test_another_user_sees_shared_secrets_only_as_a_member_and_never_personal_ones(
    running_platform, shared_tree
):
    _, as_cleo = new_user(running_platform, "cleo")
    assert cli_error("secret", "list", env=as_cleo, cwd=shared_tree)["code"] == "NOT_FOUND"
    denied = cli_error("secret", "delete", "ADMIN_ONLY", "-y", env=as_cleo, cwd=shared_tree)
    assert denied["code"] == "NOT_FOUND"

    cli_json(
        "workspace", "member", "add", "cleo@example.com", env=running_platform.env, cwd=shared_tree
    )
    listing = cli_json("secret", "list", env=as_cleo, cwd=shared_tree)
    assert ("API_KEY", "workspace") in rows(listing)
    assert all(scope == "workspace" for _, scope in rows(listing))

    # Cleo's delete of the admin's personal secret misses, with no hint that it exists.
    identity = listing["git"]["identity"]
    response = httpx.delete(
        f"{running_platform.url}/api/secrets/ADMIN_ONLY",
        params={"scope": "personal"},
        headers={"Authorization": f"Bearer {as_cleo['OSMOSIS_TOKEN']}", "X-Osmosis-Git": identity},
    )
    assert response.status_code == 404
    assert "exists_in_scope" not in response.json()["error"]["details"]
    assert "exists" not in response.json()["error"]["message"]

    env = {**as_cleo, "V": OVERRIDE_VALUE}
    cli_json("secret", "set", "API_KEY", "--env", "V", env=env, cwd=shared_tree)
    mine = rows(cli_json("secret", "list", "--scope", "personal", env=as_cleo, cwd=shared_tree))
    assert mine == {("API_KEY", "personal")}
    admins = cli_json(
        "secret", "list", "--scope", "personal", env=running_platform.env, cwd=shared_tree
    )
    assert {item["updated_by"] for item in admins["items"]} == {"admin"}


@pytest.mark.slow
def test_values_appear_nowhere_in_the_log_or_the_database_files(running_platform, shared_tree):
    home = running_platform.home
    stored = running_platform.databases.stored_bytes(running_platform.database_url)
    assert b"API_KEY" in stored  # the names are there: we are looking at the right files
    log = (home / "server.log").read_bytes()
    for value in VALUES:
        assert value.encode() not in stored
        assert value.encode() not in log


@pytest.mark.slow
def test_the_generated_key_file_is_owner_only(running_platform, shared_tree):
    key = running_platform.home / "secret.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    Fernet(key.read_bytes().strip())  # a usable key


# -- in-process: the store, resolution, and the key ----------------------------------------
def test_resolve_secrets_prefers_personal_and_lists_what_is_missing(local_platform):
    box: SecretBox = local_platform.app.state.secret_box
    with local_platform.app.state.sessions() as db:
        ada = create_user(db, name="ada", email=None, is_admin=False).user
        bob = create_user(db, name="bob", email=None, is_admin=False).user
        eve = create_user(db, name="eve", email=None, is_admin=False).user
        ws = get_or_create(db, identity="org/repo", user=ada)
        add_member(db, workspace=ws, user_id=bob.id)
        for user, scope, value in [(ada, "workspace", "shared"), (ada, "user", "ada's")]:
            set_secret(db, box=box, workspace=ws, user=user, name="KEY", scope=scope, value=value)
        set_secret(
            db, box=box, workspace=ws, user=ada, name="ONLY_WS", scope="workspace", value="w"
        )
        db.commit()

        assert resolve_secrets(
            db, box=box, workspace_id=ws.id, user_id=ada.id, names=["KEY", "ONLY_WS"]
        ) == {
            "KEY": "ada's",
            "ONLY_WS": "w",
        }
        assert resolve_secrets(db, box=box, workspace_id=ws.id, user_id=bob.id, names=["KEY"]) == {
            "KEY": "shared"
        }
        with pytest.raises(SecretsNotFound, match=r"Secret\(s\) not found: A, B"):
            resolve_secrets(
                db, box=box, workspace_id=ws.id, user_id=bob.id, names=["B", "KEY", "A"]
            )
        with pytest.raises(NotFound):
            resolve_secrets(db, box=box, workspace_id=ws.id, user_id=eve.id, names=["KEY"])


def test_a_ciphertext_moved_to_another_row_does_not_decrypt(local_platform):
    box: SecretBox = local_platform.app.state.secret_box
    with local_platform.app.state.sessions() as db:
        ada = create_user(db, name="ada", email=None, is_admin=False).user
        ws = get_or_create(db, identity="org/repo", user=ada)
        one = set_secret(db, box=box, workspace=ws, user=ada, name="ONE", scope="user", value="1")
        two = set_secret(db, box=box, workspace=ws, user=ada, name="TWO", scope="user", value="2")
        two.ciphertext = one.ciphertext
        db.commit()
        with pytest.raises(SecretUnreadable) as caught:
            resolve_secrets(db, box=box, workspace_id=ws.id, user_id=ada.id, names=["TWO"])
        assert caught.value.code == "SECRET_KEY_MISMATCH"


def test_the_key_comes_from_the_environment_when_set(tmp_path):
    key = Fernet.generate_key().decode()
    box = load_secret_box(tmp_path, env={KEY_ENV: key})
    assert box.source == KEY_ENV and not (tmp_path / "secret.key").exists()
    token = box.encrypt("v", context="c")
    assert Fernet(key.encode()).decrypt(token.encode())  # really that key
    generated = load_secret_box(tmp_path, env={})
    assert (tmp_path / "secret.key").stat().st_mode & 0o777 == 0o600
    assert (
        load_secret_box(tmp_path, env={}).decrypt(generated.encrypt("v", context="c"), context="c")
        == "v"
    )


def test_a_malformed_key_is_a_clear_error(tmp_path):
    with pytest.raises(SecretKeyError, match="OSMOSIS_SECRET_KEY is not a Fernet key"):
        load_secret_box(tmp_path, env={KEY_ENV: "not-a-key"})


def test_the_server_honours_the_key_and_refuses_a_different_one(tmp_path, databases):
    home = tmp_path / "home"
    settings = Settings.from_env(
        {"OSMOSIS_HOME": str(home), KEY_ENV: Fernet.generate_key().decode(), **databases.env(home)}
    )
    app = create_app(settings)
    with app.state.sessions() as db:
        ada = create_user(db, name="ada", email=None, is_admin=False).user
        ws = get_or_create(db, identity="org/repo", user=ada)
        set_secret(
            db, box=app.state.secret_box, workspace=ws, user=ada, name="K", scope="user", value="v"
        )
        db.commit()
        assert db.query(Secret).count() == 1
    app.state.engine.dispose()
    assert not (settings.home / "secret.key").exists()

    with pytest.raises(SecretKeyError, match="cannot decrypt the stored secrets"):
        create_app(settings.replace(secret_key=Fernet.generate_key().decode()))


def test_the_secret_tables_compile_for_postgresql_with_partial_unique_indexes(local_platform):
    from sqlalchemy.dialects import postgresql
    from sqlalchemy.schema import CreateIndex

    from osmosis.platform.core.db.migrate import current_revision, head_revision

    assert current_revision(local_platform.app.state.engine) == head_revision()
    indexes = {
        index.name: str(CreateIndex(index).compile(dialect=postgresql.dialect()))
        for index in Secret.__table__.indexes
    }
    assert "WHERE scope = 'workspace'" in indexes["uq_secrets_workspace_name"]
    assert "WHERE scope = 'user'" in indexes["uq_secrets_user_name"]


def test_one_workspace_secret_per_name(local_platform):
    from sqlalchemy.exc import IntegrityError

    with local_platform.app.state.sessions() as db:
        ada = create_user(db, name="ada", email=None, is_admin=False).user
        ws = get_or_create(db, identity="org/repo", user=ada)
        for _ in range(2):
            db.add(Secret(name="K", scope="workspace", workspace_id=ws.id, ciphertext="x"))
        with pytest.raises(IntegrityError):
            db.commit()
