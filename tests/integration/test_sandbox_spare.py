"""A spare sandboxed server (`osmosis.eval.sites.sandbox.spare`): real bwrap, real servers.

The site adopts it only when its launch is the one the site would make (its checkout and
outbox renamed into the run's places), else kills it and says what differed; a spare killed,
or whose process dies with its host, leaves no process, cgroup or directory.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from osmosis.eval.results.redact import Redactor
from osmosis.eval.sites.environment import prepare_environment
from osmosis.eval.sites.sandbox import SandboxLimits, SandboxPolicy, SandboxUnavailable, spare
from osmosis.eval.sites.sandbox.launcher import start_spare
from osmosis.eval.sites.sandbox.site import SandboxEndpoint, SandboxSite
from osmosis.rollout.protocol import RolloutInitRequest
from osmosis.rollout.types import RolloutStatus
from osmosis.testing import FakeModelServer
from tests.integration.test_sandbox import ROLLOUT, alive, gone, write_rollout

POLICY = SandboxPolicy(limits=SandboxLimits(memory_bytes=2 * 1024**3))


def quiet(_line: str) -> None:
    pass


@pytest.fixture(autouse=True)
def _no_spare_left():
    yield
    spare.discard()


def start(
    checkout: Path,
    trials_root: Path,
    *,
    env: dict[str, str] | None = None,
    policy: SandboxPolicy = POLICY,
) -> spare.Spare:
    rollout = checkout / "rollouts" / "echo"
    environment = prepare_environment(rollout, cache_root=checkout.parent / "envs", log=quiet)
    return start_spare(
        environment,
        rollout,
        "main.py",
        env=env or {"MODE": "a"},
        policy=policy,
        workspace=checkout,
        trials_root=trials_root,
        hidden=(checkout / ".osmosis",),
    )


def site_in(
    checkout: Path,
    trials_root: Path,
    lines: list[str],
    port: int,
    *,
    env: dict[str, str] | None = None,
    policy: SandboxPolicy = POLICY,
) -> SandboxSite:
    rollout = checkout / "rollouts" / "echo"
    environment = prepare_environment(rollout, cache_root=checkout.parent / "envs", log=quiet)
    return SandboxSite(
        environment,
        rollout,
        rollout / "main.py",
        env=env or {"MODE": "a"},
        trials_root=trials_root,
        log=lines.append,
        redactor=Redactor([]),
        policy=policy,
        workspace=checkout,
        bridge_url=f"http://127.0.0.1:{port}/v1",
        bridge_address=("127.0.0.1", port),
        hidden=(checkout / ".osmosis",),
        max_restarts=0,
    )


def leftovers(held: spare.Spare) -> list[Path]:
    groups = [d for d in (held.group.memory_dir, held.group.pids_dir) if d is not None]
    return [p for p in (*groups, held.site_dir, held.outbox, held.socket_path) if p.exists()]


async def test_a_run_adopts_the_spare_in_its_renamed_checkout_and_its_attempts_pass(tmp_path):
    write_rollout(tmp_path, "echo", ROLLOUT)
    ahead = tmp_path / "spare-checkout"
    (tmp_path / "ws").rename(ahead)
    held = start(ahead, tmp_path / "spare" / "rollout_trials")
    assert held.ready(30)  # bwrap has bound the checkout: it may be renamed now
    spare.hold(held)
    bridge = spare.take_bridge("127.0.0.1")
    assert bridge is not None
    port = bridge.sock.getsockname()[1]
    bridge.close()  # the fake model listens there instead of the run's bridge
    checkout = tmp_path / "run-checkout"
    ahead.rename(checkout)  # the run's checkout: the very directory the spare binds
    lines: list[str] = []
    site = site_in(checkout, tmp_path / "run" / "rollout_trials", lines, port)
    with FakeModelServer(port=port):
        await site.start(1)
        try:
            assert any("adopted the spare started" in line for line in lines), "\n".join(lines)
            endpoint = site.endpoints[0]
            assert isinstance(endpoint, SandboxEndpoint)
            assert endpoint.process.pid == held.early.popen.pid
            assert endpoint.outbox == tmp_path / "run" / "rollout_trials.sandbox"
            assert endpoint.outbox.is_dir() and not held.outbox.exists()
            request = RolloutInitRequest(
                rollout_id="r1",
                initial_messages=[{"role": "user", "content": "hi"}],
                label="graded",
                chat_completions_url=f"http://127.0.0.1:{port}/v1",
            )
            result = await endpoint.api.wait(await endpoint.api.start(request), deadline_sec=60)
            assert result.status is RolloutStatus.SUCCESS, result.err_message
        finally:
            await site.stop()
    assert leftovers(held) == []


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ("env", "environment (MODE)"),
        ("limits", "sandbox policy and limits"),
        ("checkout", "checkout"),
    ],
)
async def test_a_different_launch_kills_the_spare_and_says_what_differs(tmp_path, change, named):
    write_rollout(tmp_path, "echo", ROLLOUT)
    checkout = tmp_path / "ws"
    held = start(checkout, tmp_path / "spare" / "rollout_trials")
    spare.hold(held)
    bridge = spare.take_bridge("127.0.0.1")
    assert bridge is not None
    port = bridge.sock.getsockname()[1]
    if change == "checkout":  # the same content, another directory: a new checkout
        copy = tmp_path / "other"
        shutil.copytree(checkout, copy, symlinks=True)
        checkout = copy
    lines: list[str] = []
    site = site_in(
        checkout,
        tmp_path / "run" / "rollout_trials",
        lines,
        port,
        env={"MODE": "b"} if change == "env" else None,
        policy=SandboxPolicy(limits=SandboxLimits(memory_bytes=3 * 1024**3))
        if change == "limits"
        else POLICY,
    )
    try:
        await site.start(1)
        assert f"rollout server: the spare was not adopted: it differs in {named}" in lines
        assert not any("adopted the spare" in line for line in lines)
        assert not alive(held.early.popen.pid) and leftovers(held) == []
        endpoint = site.endpoints[0]
        assert isinstance(endpoint, SandboxEndpoint)
        assert (await endpoint.api.health())["status"] == "ok"  # its own server instead
        assert not any("b" in value for value in lines if "MODE" in value)  # no value said
    finally:
        await site.stop()
        bridge.close()


def test_a_spare_killed_or_outlived_by_its_host_leaves_nothing(tmp_path):
    write_rollout(tmp_path, "echo", ROLLOUT)
    checkout = tmp_path / "ws"
    held = start(checkout, tmp_path / "spare" / "rollout_trials")
    pid = held.early.popen.pid
    held.kill()
    assert not alive(pid) and leftovers(held) == []
    held.kill()  # idempotent

    script = HOST.format(tests=str(Path(__file__).resolve().parents[2]), ws=str(checkout))
    host = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert host.stdout is not None
        said = json.loads(host.stdout.readline())
    finally:
        host.kill()
        host.wait()
        if host.stdout is not None:
            host.stdout.close()
    assert gone([int(p) for p in said["pids"]], seconds=10)
    for group in said["groups"]:  # what a killed host leaves; the next spare sweeps it later
        Path(group).rmdir()


HOST = """
import json, os, sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
from tests.integration.test_sandbox_spare import start

held = start(Path({ws!r}), Path({ws!r}).parent / "host" / "rollout_trials")
os.read(held.early.ready_fd, 1)  # about to listen: every process is in the cgroup
groups = [str(d) for d in (held.group.memory_dir, held.group.pids_dir) if d]
directory = held.group.pids_dir or held.group.memory_dir
print(json.dumps({{"pids": (directory / "cgroup.procs").read_text().split(),
                  "groups": groups}}), flush=True)
time.sleep(3600)
"""


async def test_a_spare_started_before_the_probe_answered_is_not_adopted_when_it_fails(tmp_path):
    """A spare starts without waiting for the sandbox probe (it runs beside the server's
    start). When the probe then says the sandbox does not work here, the site does not adopt
    the spare, fails with the probe's reason and fix, and nothing of the spare is left."""
    write_rollout(tmp_path, "echo", ROLLOUT)
    checkout = tmp_path / "ws"
    broken = tmp_path / "bwrap"
    broken.write_text(
        "#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n"
    )
    broken.chmod(0o755)
    policy = SandboxPolicy(bwrap=broken, limits=POLICY.limits)
    held = start(checkout, tmp_path / "spare" / "rollout_trials", policy=policy)
    assert held.support.version is None  # assumed, not probed: the probe was not awaited
    spare.hold(held)
    bridge = spare.take_bridge("127.0.0.1")
    assert bridge is not None
    port = bridge.sock.getsockname()[1]
    lines: list[str] = []
    site = site_in(checkout, tmp_path / "run" / "rollout_trials", lines, port, policy=policy)
    try:
        with pytest.raises(SandboxUnavailable, match="No permissions to create new namespace"):
            await site.start(1)
    finally:
        await site.stop()
        bridge.close()
    assert "rollout server: the spare was not adopted: it differs in sandbox support" in lines
    assert not alive(held.early.popen.pid) and leftovers(held) == []
