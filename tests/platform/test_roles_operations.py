"""Operating a platform of several processes (issue 14.4): health says whether the database and
the blob store answer, and no process serves a schema it does not know."""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3

import httpx
import pytest

from osmosis.platform import create_app
from osmosis.platform.api.health import PROBE_EVERY_SEC
from osmosis.platform.core.db.migrate import head_revision
from tests.platform.conftest import clean_env, free_port, osmosis


async def health(app) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://platform.test") as client:
        return await client.get("/api/health")


async def test_health_reports_the_database_and_the_blob_store(local_platform):
    response = await health(local_platform.app)
    assert response.status_code == 200
    body = response.json()
    assert (body["status"], body["role"]) == ("ok", "all")
    assert body["database"]["ok"] is True and body["database"]["error"] is None
    assert body["blob_store"]["ok"] is True
    assert body["blob_store"]["detail"]["root"] == str(local_platform.settings.blob_dir)


async def test_health_is_503_while_the_blob_store_is_gone(local_platform):
    shutil.rmtree(local_platform.settings.blob_dir)  # an unmounted share, say
    local_platform.app.state.health_probe = None  # no cached answer from an earlier test
    response = await health(local_platform.app)
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "degraded" and body["database"]["ok"] is True
    assert body["blob_store"]["ok"] is False
    assert str(local_platform.settings.blob_dir) in body["blob_store"]["error"]


@pytest.mark.parametrize("database_kind", ["postgresql"], indirect=True)
async def test_health_is_503_when_the_database_is_gone(tmp_path, databases, postgres):
    settings = databases.settings(tmp_path / "home")
    app = create_app(settings)
    try:
        assert (await health(app)).status_code == 200
        postgres.drop_database(settings.database_url)
        await asyncio.sleep(PROBE_EVERY_SEC + 0.1)  # past the probe's last answer
        response = await health(app)
        assert response.status_code == 503
        body = response.json()
        assert body["database"]["ok"] is False and body["database"]["error"]
        assert body["blob_store"]["ok"] is True
    finally:
        app.state.engine.dispose()


def test_no_role_serves_a_newer_schema_and_migrate_refuses_it_too(tmp_path):
    home = tmp_path / "home"
    env = clean_env(OSMOSIS_HOME=str(home), OSMOSIS_SANDBOX="off")
    assert osmosis("server", "migrate", env=env).returncode == 0
    with sqlite3.connect(home / "platform.db") as db:  # as if a newer osmosis had migrated
        db.execute("UPDATE alembic_version SET version_num = '9999'")
    for role in ("all", "api", "worker"):
        started = osmosis(
            "--json", "server", "start", "--role", role, "--port", str(free_port()), env=env
        )
        assert started.returncode == 1, (role, started.stdout)
        error = json.loads(started.stderr.splitlines()[-1])["error"]
        assert error["code"] == "VALIDATION"
        assert "revision 9999, newer than this osmosis knows" in error["message"], role
        assert f"its newest is {head_revision()}" in error["message"]
    migrated = osmosis("--json", "server", "migrate", env=env)
    assert migrated.returncode == 1
    error = json.loads(migrated.stderr)["error"]
    assert error["code"] == "CONFLICT" and "upgrade osmosis here" in error["message"]
    status = json.loads(osmosis("--json", "server", "status", env=env).stdout)["data"]
    assert "newer than this osmosis knows" in status["database"]["problem"]
