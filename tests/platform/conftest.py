"""Worlds for platform tests: an in-process app on a temporary home, and a real server process,
each on SQLite and on PostgreSQL (`databases`: see tests/platform/databases.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from osmosis.platform import Settings, create_app
from tests.platform.databases import (
    Databases,
    PostgresCluster,
    PostgresUnavailable,
    parametrize_only,
    selected_kinds,
    shared_cluster,
    stop_shared_cluster,
)
from tests.ports import free_port

CLI = [sys.executable, "-c", "from osmosis.cli.main import run; run()"]


def clean_env(**extra: str) -> dict[str, str]:
    """The caller's environment without any osmosis settings, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS_")}
    env.update(extra)
    return env


def osmosis(
    *args: str, env: Mapping[str, str], timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], env=dict(env), capture_output=True, text=True, timeout=timeout
    )


def osmosis_json(*args: str, env: Mapping[str, str]) -> dict:
    result = osmosis("--json", *args, env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


# -- the databases -----------------------------------------------------------------------------
# Session-scoped and parametrised: every test that uses a world below runs once per database
# kind, and pytest groups the tests of one kind together.
@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    parametrize_only(metafunc)


@pytest.fixture(scope="session", params=selected_kinds())
def database_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresCluster]:
    """This test process's PostgreSQL (a throwaway cluster, started once)."""
    try:
        cluster = shared_cluster()
    except PostgresUnavailable as error:
        pytest.fail(f"PostgreSQL is needed and unavailable: {error}", pytrace=False)
    yield cluster
    stop_shared_cluster()


def _databases(kind: str, request: pytest.FixtureRequest) -> Databases:
    cluster = request.getfixturevalue("postgres") if kind == "postgresql" else None
    return Databases(kind=kind, cluster=cluster)


@pytest.fixture
def databases(database_kind: str, request: pytest.FixtureRequest) -> Iterator[Databases]:
    """This test's databases: `url(home)`, `env(home)`, `settings(home)`, `new_url()`."""
    found = _databases(database_kind, request)
    yield found
    found.close()


@pytest.fixture(scope="module")
def module_databases(database_kind: str, request: pytest.FixtureRequest) -> Iterator[Databases]:
    """The same, for worlds that live as long as their module."""
    found = _databases(database_kind, request)
    yield found
    found.close()


# -- in-process ------------------------------------------------------------------------------
@dataclass
class LocalPlatform:
    app: FastAPI
    settings: Settings
    admin_token: str


@pytest.fixture
def local_platform(tmp_path: Path, databases: Databases) -> Iterator[LocalPlatform]:
    settings = databases.settings(tmp_path / "home")
    app = create_app(settings)
    token = json.loads(settings.credentials_file.read_text())["token"]
    yield LocalPlatform(app=app, settings=settings, admin_token=token)
    app.state.engine.dispose()


@pytest.fixture
async def api(local_platform: LocalPlatform) -> AsyncIterator[httpx.AsyncClient]:
    """An ASGI client holding the admin token; unexpected errors come back as responses."""
    transport = httpx.ASGITransport(app=local_platform.app, raise_app_exceptions=False)
    headers = {"Authorization": f"Bearer {local_platform.admin_token}"}
    async with httpx.AsyncClient(
        transport=transport, base_url="http://platform.test", headers=headers
    ) as client:
        yield client


# -- a real server process ---------------------------------------------------------------------
@dataclass
class RunningPlatform:
    url: str
    home: Path
    config_dir: Path
    env: dict[str, str]
    databases: Databases

    @property
    def database_url(self) -> str:
        return self.databases.url(self.home)

    @property
    def admin_token(self) -> str:
        return str(json.loads((self.home / "credentials.json").read_text())["token"])


@pytest.fixture(scope="module")
def running_platform(
    tmp_path_factory: pytest.TempPathFactory, module_databases: Databases
) -> Iterator[RunningPlatform]:
    """`osmosis server start --detach` on a free loopback port with a temporary home."""
    root = tmp_path_factory.mktemp("platform")
    home, config_dir = root / "home", root / "config"
    env = clean_env(
        OSMOSIS_HOME=str(home), OSMOSIS_CONFIG_DIR=str(config_dir), **module_databases.env(home)
    )
    port = free_port()
    started = osmosis("server", "start", "--detach", "--port", str(port), env=env)
    assert started.returncode == 0, started.stderr + started.stdout
    try:
        yield RunningPlatform(
            url=f"http://127.0.0.1:{port}",
            home=home,
            config_dir=config_dir,
            env=env,
            databases=module_databases,
        )
    finally:
        osmosis("server", "stop", env=env)
