"""The local site and a rollout server started before the run asked for it (`sites.prestart`):
adopted when its launch is the one the site would make, killed and reaped otherwise; real
processes on loopback."""

from __future__ import annotations

import socket
import sys
import textwrap
from pathlib import Path

import pytest

from osmosis.eval.results.redact import Redactor
from osmosis.eval.sites import prestart
from osmosis.eval.sites.environment import RolloutEnvironment
from osmosis.eval.sites.local import LocalProcessSite
from osmosis.eval.sites.rollout_process import RolloutStartError

CURRENT = RolloutEnvironment(
    python=Path(sys.executable), kind="current", cache_key=None, sdk="osmosis"
)

MAIN = """
import os, uvicorn
from osmosis import AgentWorkflow, Grader, LocalBackend, create_rollout_server

if os.environ.get("CRASH_AT_IMPORT"):
    raise RuntimeError("boom: the tool registry is missing")


class Echo(AgentWorkflow):
    async def run(self, ctx):
        return ctx.prompt


class Zero(Grader):
    async def grade(self, ctx):
        ctx.set_reward(0.0)


app = create_rollout_server(backend=LocalBackend(workflow=Echo, grader=Zero),
                            configure_logging=False)

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]),
                log_level="warning")
"""


def _rollout(tmp_path: Path) -> Path:
    rollout = tmp_path / "echo"
    rollout.mkdir()
    (rollout / "main.py").write_text(textwrap.dedent(MAIN))
    return rollout


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def _site(rollout: Path, tmp_path: Path, env: dict[str, str], log: list[str]) -> LocalProcessSite:
    return LocalProcessSite(
        CURRENT,
        rollout,
        rollout / "main.py",
        env=env,
        trials_root=tmp_path / "run" / "rollout_trials",
        log=log.append,
        redactor=Redactor([]),
    )


def _early(rollout: Path, tmp_path: Path, env: dict[str, str]) -> prestart.Prestarted:
    early = prestart.start_early(
        rollout,
        str(rollout / "main.py"),
        env=env,
        artifact_root=tmp_path / "run" / "rollout_trials",
    )
    assert early is not None
    return early


@pytest.fixture(autouse=True)
def _no_early_server_left():
    yield
    prestart.discard()  # a failed test must not leave one for the next


async def test_the_site_adopts_an_early_server_with_the_same_launch(tmp_path):
    rollout = _rollout(tmp_path)
    early = _early(rollout, tmp_path, {"GREETING": "hello"})
    assert not (tmp_path / "run").exists()  # nothing on disk before the run opens it
    log: list[str] = []
    site = _site(rollout, tmp_path, {"GREETING": "hello"}, log)
    try:
        await site.start(1)
        (endpoint,) = site.endpoints
        assert endpoint.process.pid == early.popen.pid  # no second server
        assert endpoint.base_url == f"http://127.0.0.1:{early.port}"
        assert endpoint.capacity is not None  # its /health answered through the site
        assert (tmp_path / "run" / "rollout_trials").is_dir()
        assert any("started at the command's entry" in line and "adopted" in line for line in log)
        assert prestart.claim() is None  # adopted once
    finally:
        await site.stop()
    assert not _alive(early.popen.pid)


async def test_a_different_launch_kills_the_early_server_and_starts_the_sites_own(tmp_path):
    rollout = _rollout(tmp_path)
    early = _early(rollout, tmp_path, {"API_TOKEN": "first-value-1234"})
    log: list[str] = []
    site = _site(rollout, tmp_path, {"API_TOKEN": "second-value-5678"}, log)
    try:
        await site.start(1)
        (endpoint,) = site.endpoints
        assert endpoint.process.pid != early.popen.pid
        assert early.popen.returncode == -9  # SIGKILLed and reaped by us
        assert not _alive(early.popen.pid)
        (note,) = [line for line in log if "started at the command's entry" in line]
        assert "environment (API_TOKEN) differs" in note
        assert "value" not in note  # names only: a value may be a secret
    finally:
        await site.stop()


async def test_several_replicas_kill_the_early_server(tmp_path):
    rollout = _rollout(tmp_path)
    early = _early(rollout, tmp_path, {})
    log: list[str] = []
    site = _site(rollout, tmp_path, {}, log)
    try:
        await site.start(2)
        assert early.popen.pid not in [e.process.pid for e in site.endpoints]  # type: ignore[attr-defined]
        assert len(site.endpoints) == 2
        assert early.popen.returncode == -9
        assert any("the run starts 2 rollout servers" in line for line in log)
    finally:
        await site.stop()


async def test_an_early_server_that_died_fails_the_start_with_its_output(tmp_path):
    rollout = _rollout(tmp_path)
    early = _early(rollout, tmp_path, {"CRASH_AT_IMPORT": "1"})
    site = _site(rollout, tmp_path, {"CRASH_AT_IMPORT": "1"}, [])
    with pytest.raises(RolloutStartError) as failed:
        await site.start(1)
    assert failed.value.returncode == 1
    assert "boom: the tool registry is missing" in str(failed.value)
    assert early.popen.returncode == 1  # reaped
    assert site.endpoints == []


async def test_an_early_server_whose_port_was_taken_is_started_again_on_another(tmp_path):
    rollout = _rollout(tmp_path)
    early = _early(rollout, tmp_path, {})
    log: list[str] = []
    site = _site(rollout, tmp_path, {}, log)
    # Taken while the early server imports (hundreds of milliseconds before it binds).
    with socket.socket() as thief:
        thief.bind(("127.0.0.1", early.port))
        try:
            await site.start(1)
            (endpoint,) = site.endpoints
            assert endpoint.process.pid != early.popen.pid
            assert endpoint.base_url != f"http://127.0.0.1:{early.port}"
            assert early.popen.returncode not in (None, 0)  # it failed to bind, and exited
            assert any(
                f"port {early.port} was taken before it could listen" in line for line in log
            )
        finally:
            await site.stop()


def test_discard_kills_and_reaps_an_unclaimed_early_server(tmp_path):
    rollout = _rollout(tmp_path)
    early = _early(rollout, tmp_path, {})
    prestart.discard()
    assert early.popen.returncode == -9
    assert not _alive(early.popen.pid)
    assert prestart.claim() is None
    prestart.discard()  # idempotent
