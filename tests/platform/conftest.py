"""Worlds for platform tests: an in-process app on a temporary home, and a real server process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from osmosis.platform import Settings, create_app

CLI = [sys.executable, "-c", "from osmosis.cli.main import run; run()"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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


# -- in-process ------------------------------------------------------------------------------
@dataclass
class LocalPlatform:
    app: FastAPI
    settings: Settings
    admin_token: str


@pytest.fixture
def local_platform(tmp_path: Path) -> Iterator[LocalPlatform]:
    settings = Settings(home=tmp_path / "home")
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

    @property
    def admin_token(self) -> str:
        return str(json.loads((self.home / "credentials.json").read_text())["token"])


@pytest.fixture(scope="module")
def running_platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningPlatform]:
    """`osmosis server start --detach` on a free loopback port with a temporary home."""
    root = tmp_path_factory.mktemp("platform")
    home, config_dir = root / "home", root / "config"
    env = clean_env(OSMOSIS_HOME=str(home), OSMOSIS_CONFIG_DIR=str(config_dir))
    port = free_port()
    started = osmosis("server", "start", "--detach", "--port", str(port), env=env)
    assert started.returncode == 0, started.stderr + started.stdout
    try:
        yield RunningPlatform(
            url=f"http://127.0.0.1:{port}", home=home, config_dir=config_dir, env=env
        )
    finally:
        osmosis("server", "stop", env=env)
