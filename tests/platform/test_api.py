"""The API in-process, through an ASGI client: auth, admin routes and the error envelope."""

from __future__ import annotations

import logging

import httpx
import pytest
from fastapi import HTTPException

from osmosis.platform import create_app
from osmosis.platform.core.errors import NotFound
from osmosis.platform.services.tokens import TOKEN_PREFIX


def envelope(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "details"}
    return body["error"]


async def test_health_needs_no_token(api):
    response = await api.get("/api/health", headers={"Authorization": ""})
    assert response.status_code == 200
    assert response.json()["status"] == "ok"


async def test_whoami_names_the_first_admin(api):
    response = await api.get("/api/auth/whoami")
    assert response.status_code == 200
    body = response.json()
    assert body["user"]["name"] == "admin" and body["user"]["is_admin"] is True
    assert body["token"]["name"] == "default"
    assert "token_hash" not in body["token"]


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({}, "required"),
        ({"Authorization": "Bearer osm_not-a-real-token"}, "not valid"),
        ({"Authorization": "Basic YWRtaW46YWRtaW4="}, "required"),
    ],
)
async def test_missing_or_bad_tokens_get_401(local_platform, headers, message):
    transport = httpx.ASGITransport(app=local_platform.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        response = await client.get("/api/auth/whoami", headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    error = envelope(response)
    assert error["code"] == "AUTH_REQUIRED" and message in error["message"]


async def test_admin_creates_a_user_whose_token_works_but_is_not_admin(api):
    created = await api.post("/api/admin/users", json={"name": "ada", "email": "ada@example.com"})
    assert created.status_code == 201
    body = created.json()
    secret = body["token"]["token"]
    assert secret.startswith(TOKEN_PREFIX) and len(secret) > 40
    assert body["user"]["is_admin"] is False

    as_ada = {"Authorization": f"Bearer {secret}"}
    whoami = await api.get("/api/auth/whoami", headers=as_ada)
    assert whoami.json()["user"]["email"] == "ada@example.com"
    forbidden = await api.get("/api/admin/users", headers=as_ada)
    assert forbidden.status_code == 403
    assert envelope(forbidden)["code"] == "FORBIDDEN"


async def test_admin_issues_more_tokens_and_lists_users_in_pages(api):
    user = (await api.post("/api/admin/users", json={"name": "bob"})).json()["user"]
    issued = await api.post(f"/api/admin/users/{user['id']}/tokens", json={"name": "ci"})
    assert issued.status_code == 201
    assert issued.json()["name"] == "ci" and issued.json()["user_id"] == user["id"]

    first = (await api.get("/api/admin/users", params={"limit": 1})).json()
    assert (first["total_count"], first["has_more"], first["next_offset"]) == (2, True, 1)
    second = (await api.get("/api/admin/users", params={"limit": 1, "offset": 1})).json()
    assert [u["name"] for u in second["users"]] == ["bob"]
    assert (second["has_more"], second["next_offset"]) == (False, None)


async def test_unknown_user_is_not_found(api):
    response = await api.post("/api/admin/users/nobody/tokens", json={})
    assert response.status_code == 404
    assert envelope(response) == {
        "code": "NOT_FOUND",
        "message": "no user with id 'nobody'",
        "details": {"user_id": "nobody"},
    }


async def test_duplicate_user_is_a_conflict(api):
    await api.post("/api/admin/users", json={"name": "cy", "email": "cy@example.com"})
    again = await api.post("/api/admin/users", json={"name": "cy2", "email": "cy@example.com"})
    assert again.status_code == 409
    assert envelope(again)["details"] == {"field": "email"}


@pytest.mark.parametrize(
    "body",
    [
        {"name": ""},
        {"name": "has space"},
        {"name": "ok", "email": "not-an-email"},
        {"name": "ok", "unexpected": 1},
        ["not", "an", "object"],
    ],
)
async def test_invalid_bodies_get_the_validation_envelope(api, body):
    response = await api.post("/api/admin/users", json=body)
    assert response.status_code == 422
    error = envelope(response)
    assert error["code"] == "VALIDATION"
    assert error["details"]["issues"] and all("loc" in i for i in error["details"]["issues"])


async def test_malformed_json_is_a_validation_error(api):
    response = await api.post(
        "/api/admin/users", content=b"{", headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 422
    assert envelope(response)["code"] == "VALIDATION"


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/api/nowhere", 404, "NOT_FOUND"),
        ("DELETE", "/api/health", 405, "METHOD_NOT_ALLOWED"),
    ],
)
async def test_framework_errors_use_the_envelope(api, method, path, status, code):
    response = await api.request(method, path)
    assert response.status_code == status
    assert envelope(response)["code"] == code


async def test_one_handler_for_platform_http_and_unexpected_errors(tmp_path, caplog):
    from osmosis.platform.core.settings import Settings

    app = create_app(Settings(home=tmp_path))

    def not_found() -> None:
        raise NotFound("no such thing", details={"id": "x"})

    def teapot() -> None:
        raise HTTPException(418, "short and stout")

    def boom() -> None:
        raise RuntimeError("secret internals")

    for path, endpoint in {"/t/nf": not_found, "/t/teapot": teapot, "/t/boom": boom}.items():
        app.add_api_route(path, endpoint)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            nf = await client.get("/t/nf")
            teapot_response = await client.get("/t/teapot")
            with caplog.at_level(logging.ERROR, logger="osmosis.platform"):
                crash = await client.get("/t/boom")
    finally:
        app.state.engine.dispose()

    assert (nf.status_code, envelope(nf)["details"]) == (404, {"id": "x"})
    assert teapot_response.status_code == 418
    assert envelope(teapot_response)["message"] == "short and stout"
    assert crash.status_code == 500
    assert envelope(crash) == {
        "code": "INTERNAL",
        "message": "internal server error",
        "details": {},
    }
    assert "secret internals" not in crash.text and "Traceback" not in crash.text
    assert "RuntimeError: secret internals" in caplog.text  # the traceback went to the log


async def test_tokens_are_stored_hashed(local_platform, api):
    created = (await api.post("/api/admin/users", json={"name": "dee"})).json()
    from sqlalchemy import select

    from osmosis.platform.core.db import ApiToken
    from osmosis.platform.services.tokens import hash_token

    with local_platform.app.state.sessions() as db:
        hashes = set(db.scalars(select(ApiToken.token_hash)))
    secret = created["token"]["token"]
    assert hash_token(secret) in hashes and secret not in hashes


def test_migrations_reach_head_and_are_idempotent(local_platform):
    from osmosis.platform.core.db.migrate import current_revision, head_revision, upgrade

    engine = local_platform.app.state.engine
    assert current_revision(engine) == head_revision() != "0001"
    upgrade(engine)  # a second start finds nothing to do
    assert current_revision(engine) == head_revision()


@pytest.mark.databases("sqlite")
def test_sqlite_runs_in_wal_with_foreign_keys(local_platform):
    from sqlalchemy import text

    with local_platform.app.state.engine.connect() as connection:
        assert connection.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert connection.execute(text("PRAGMA foreign_keys")).scalar() == 1
        assert connection.execute(text("PRAGMA synchronous")).scalar() == 1  # NORMAL


def test_first_start_writes_owner_only_credentials_and_later_starts_keep_them(local_platform):
    path = local_platform.settings.credentials_file
    assert path.stat().st_mode & 0o777 == 0o600
    again = create_app(local_platform.settings.replace(port=9999))
    again.state.engine.dispose()
    import json

    data = json.loads(path.read_text())
    assert data["token"] == local_platform.admin_token
    assert data["platform_url"] == "http://127.0.0.1:9999"
    assert path.stat().st_mode & 0o777 == 0o600


def test_the_migrations_match_the_models(local_platform):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from osmosis.platform.core.db import Base

    with local_platform.app.state.engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []


def test_the_schema_compiles_for_postgresql():
    from sqlalchemy.dialects import postgresql
    from sqlalchemy.schema import CreateTable

    from osmosis.platform.core.db import Base

    ddl = {
        table.name: str(CreateTable(table).compile(dialect=postgresql.dialect()))
        for table in Base.metadata.sorted_tables
    }
    assert set(ddl) >= {
        "users",
        "api_tokens",
        "workspaces",
        "workspace_members",
        "secrets",
        "datasets",
        "dataset_versions",
        "dataset_logs",
        "eval_runs",
        "eval_attempts",
    }
    assert "is_admin BOOLEAN" in ddl["users"]
    assert "created_at TIMESTAMP WITH TIME ZONE" in ddl["users"]
    assert "ON DELETE CASCADE" in ddl["api_tokens"]


def test_an_unusable_database_is_reported_without_its_password(tmp_path):
    from osmosis.platform.core.db.engine import DatabaseUnavailable
    from osmosis.platform.core.settings import Settings

    directory = tmp_path / "not-a-file"
    directory.mkdir()
    # SQLite cannot open a directory as a database: an OperationalError at migration time.
    settings = Settings(home=tmp_path, database_url=f"sqlite:///{directory}")
    with pytest.raises(DatabaseUnavailable, match="cannot use the database"):
        create_app(settings)


def test_postgresql_without_its_driver_or_server_is_a_clear_error(tmp_path):
    from osmosis.platform.core.db.engine import DatabaseUnavailable
    from osmosis.platform.core.settings import Settings

    url = "postgresql+psycopg://u:hunter2@127.0.0.1:1/db"
    with pytest.raises(DatabaseUnavailable) as caught:
        create_app(Settings(home=tmp_path, database_url=url))
    message = str(caught.value)
    assert "hunter2" not in message
    # Without psycopg the fix is named; with it, nothing listens on port 1.
    assert "install osmosis-eval[postgres]" in message or "cannot use the database" in message


@pytest.mark.parametrize(
    "path", ["/api/admin/users", "/api/secrets", "/api/datasets", "/api/eval-runs"]
)
async def test_every_listing_refuses_an_offset_past_what_the_database_can_hold(api, path):
    headers = {"X-Osmosis-Git": "example-org/ws"}
    fine = await api.get(path, params={"offset": 2**31 - 1}, headers=headers)
    assert fine.status_code == 200, fine.text
    huge = await api.get(path, params={"offset": 10**20}, headers=headers)
    assert huge.status_code == 422, huge.text
    assert envelope(huge)["code"] == "VALIDATION"
