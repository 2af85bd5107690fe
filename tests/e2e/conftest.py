"""Worlds for end-to-end runs of the `osmosis` command against the scripted model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from osmosis.testing import FakeModelServer

CLI = [sys.executable, "-c", "from osmosis.cli.main import run; run()"]


@pytest.fixture(scope="module")
def fake_model() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


def model_env(server: FakeModelServer, **extra: str) -> dict[str, str]:
    """The environment a user would export to point `openai/...` at the scripted model."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OSMOSIS_", "OPENAI_"))}
    env.update(OPENAI_API_BASE=server.base_url, OPENAI_API_KEY="sk-test-not-a-real-key")
    env.update(extra)
    return env


def osmosis(
    *args: str, cwd: Path, env: Mapping[str, str], timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], cwd=cwd, env=dict(env), capture_output=True, text=True, timeout=timeout
    )


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
