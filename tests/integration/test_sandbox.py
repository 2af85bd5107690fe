"""The sandbox site on its own: real bwrap, real rollout servers, no platform server.

What the platform tests (tests/platform/test_sandbox.py) cannot see from outside: the sandbox
dies with the engine, a sandboxed server killed by its host pid is replaced, stopping leaves
no process, cgroup or socket behind, and `eval run --sandbox` works locally.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import osmosis.eval.sites.sandbox.limits as limits
from osmosis.eval.results.redact import Redactor
from osmosis.eval.sites.environment import prepare_environment
from osmosis.eval.sites.sandbox import SandboxLimits, SandboxPolicy
from osmosis.eval.sites.sandbox.layout import interpreter_dirs
from osmosis.eval.sites.sandbox.site import SandboxEndpoint, SandboxSite
from osmosis.rollout.protocol import RolloutInitRequest
from osmosis.rollout.types import RolloutStatus
from osmosis.testing import FakeModelServer
from tests.e2e.conftest import model_env, osmosis
from tests.e2e.workspace import SCRIPTED_MAIN, make_workspace, row

ROLLOUT = """
import os, uvicorn
from osmosis import AgentWorkflow, Grader, LocalBackend, create_rollout_server

class Echo(AgentWorkflow):
    async def run(self, ctx):
        return [*ctx.prompt, await ctx.chat(ctx.prompt)]

class One(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0)

app = create_rollout_server(backend=LocalBackend(workflow=Echo, grader=One))
if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]),
                log_level="warning")
"""


def write_rollout(tmp_path: Path, name: str, source: str) -> Path:
    directory = tmp_path / "ws" / "rollouts" / name
    directory.mkdir(parents=True)
    (directory / "main.py").write_text(textwrap.dedent(source))
    return directory


@pytest.fixture
def rollout(tmp_path: Path) -> Path:
    return write_rollout(tmp_path, "echo", ROLLOUT)


def site_for(
    rollout: Path,
    tmp_path: Path,
    lines: list[str],
    policy: SandboxPolicy | None = None,
    on_spawned: Callable[[], None] | None = None,
) -> SandboxSite:
    environment = prepare_environment(rollout, cache_root=tmp_path / "envs", log=lines.append)
    return SandboxSite(
        environment,
        rollout,
        "main.py",
        env={},
        trials_root=tmp_path / "run" / "rollout_trials",
        log=lines.append,
        redactor=Redactor([]),
        policy=policy or SandboxPolicy(),
        workspace=rollout.parent.parent,
        bridge_url="http://127.0.0.1:45999/v1",
        bridge_address=("127.0.0.1", 45999),
        max_restarts=1,
        on_spawned=on_spawned,
    )


def sandbox_pids(endpoint: SandboxEndpoint) -> list[int]:
    """Host pids of everything in the endpoint's sandbox (its cgroup), bwrap included."""
    directory = endpoint.group.pids_dir or endpoint.group.memory_dir
    assert directory is not None, "these machines have a writable cgroup"
    return [int(pid) for pid in (directory / "cgroup.procs").read_text().split()]


def server_pid(endpoint: SandboxEndpoint) -> int:
    """The host pid of the rollout server itself (`python main.py`, not bwrap or the shim)."""
    for pid in sandbox_pids(endpoint):
        command = [part for part in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if part]
        if command and command[-1].endswith(b"main.py") and b"shim.py" not in b" ".join(command):
            return pid
    raise AssertionError("no rollout server in the sandbox")


def gone(pids: list[int], *, seconds: float) -> bool:
    """Whether every pid is gone (or a zombie) within `seconds`: exits take a moment."""
    deadline = time.monotonic() + seconds
    while [pid for pid in pids if alive(pid)]:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def test_a_server_killed_by_its_host_pid_is_replaced_and_stop_leaves_nothing(
    rollout, tmp_path
):
    lines: list[str] = []
    spawns: list[str] = []  # the run's bridge waits for them (`SiteContext.on_spawned`)
    site = site_for(rollout, tmp_path, lines, on_spawned=lambda: spawns.append("spawned"))
    await site.start(1)
    try:
        assert spawns == ["spawned"]
        first = site.endpoints[0]
        assert isinstance(first, SandboxEndpoint)
        assert (await first.api.health())["status"] == "ok"
        group_dirs = [first.group.memory_dir, first.group.pids_dir]
        os.kill(server_pid(first), signal.SIGKILL)
        await asyncio.wait_for(first.dead.wait(), 10)
        assert "exited unexpectedly" in first.death_reason
        assert not first.death_reason.startswith("resource_limit")  # a kill is not a limit
        second = await site.replace(first, first.death_reason)
        assert isinstance(second, SandboxEndpoint)
        assert (await second.api.health())["status"] == "ok"
        assert "restarting rollout server echo (restart 1 of 1 within 10 minutes)" in lines
        assert spawns == ["spawned"] * 2
        assert not any(d is not None and d.exists() for d in group_dirs)
        pids, socket_path = sandbox_pids(second), second.socket_path
    finally:
        await site.stop()
    assert gone(pids, seconds=5)
    assert not socket_path.exists() and not site.outbox.exists()
    assert not any(d is not None and d.exists() for d in (second.group.memory_dir,))


# ROLLOUT, with a workflow that allocates as many bytes as its prompt says and no model call.
ALLOCATOR = ROLLOUT.replace(
    """class Echo(AgentWorkflow):
    async def run(self, ctx):
        return [*ctx.prompt, await ctx.chat(ctx.prompt)]
""",
    """class Allocate(AgentWorkflow):
    async def run(self, ctx):
        block = bytearray(int(ctx.prompt[-1]["content"]))
        return [*ctx.prompt, {"role": "assistant", "content": str(len(block))}]
""",
).replace("workflow=Echo", "workflow=Allocate")


async def test_without_a_writable_cgroup_rlimits_fail_only_the_allocation_past_them(
    tmp_path, monkeypatch
):
    """Where no cgroup can be made (a container without delegation), the memory limit is
    the address space of each process: an allocation past it fails its attempt as a
    resource limit, and the server, within it, goes on serving."""
    monkeypatch.setattr(limits, "_make_v2", lambda *_: None)
    monkeypatch.setattr(limits, "_make_v1", lambda *_: None)
    rollout = write_rollout(tmp_path, "allocate", ALLOCATOR)
    lines: list[str] = []
    policy = SandboxPolicy(limits=SandboxLimits(memory_bytes=2 * 1024**3))
    site = site_for(rollout, tmp_path, lines, policy)
    await site.start(1)
    try:
        endpoint = site.endpoints[0]
        assert isinstance(endpoint, SandboxEndpoint) and not endpoint.group.is_cgroup
        assert any("sandbox limits via rlimits (no writable cgroup)" in line for line in lines)

        async def allocate(size: int) -> tuple[RolloutStatus, str | None]:
            request = RolloutInitRequest(
                rollout_id=f"r{size}",
                initial_messages=[{"role": "user", "content": str(size)}],
                label="graded",
                chat_completions_url="http://127.0.0.1:45999/v1",
            )
            result = await endpoint.api.wait(await endpoint.api.start(request), deadline_sec=60)
            return result.status, result.err_message

        status, message = await allocate(4 * 1024**3)
        assert status is RolloutStatus.FAILURE
        assert message is not None and "memory limit" in message and "MemoryError" in message
        assert await allocate(64 * 1024**2) == (RolloutStatus.SUCCESS, None)
        assert not endpoint.dead.is_set()
    finally:
        await site.stop()


HOST = """
import asyncio, json, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from tests.integration.test_sandbox import site_for

async def main():
    site = site_for(Path({rollout!r}), Path({tmp!r}), [])
    await site.start(1)
    endpoint = site.endpoints[0]
    directory = endpoint.group.pids_dir or endpoint.group.memory_dir
    groups = [str(d) for d in (endpoint.group.memory_dir, endpoint.group.pids_dir) if d]
    print(json.dumps({{"pids": (directory / "cgroup.procs").read_text().split(),
                      "groups": groups}}), flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def test_the_sandbox_dies_with_the_engine_even_when_it_is_killed(rollout, tmp_path):
    """SIGKILL of the engine: no cleanup code runs, and still no process of the sandbox
    outlives it (parent-death signal on bwrap, --die-with-parent, the PID namespace)."""
    script = HOST.format(
        tests=str(Path(__file__).resolve().parents[2]), rollout=str(rollout), tmp=str(tmp_path)
    )
    host = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert host.stdout is not None
        said = json.loads(host.stdout.readline())
        pids = [int(pid) for pid in said["pids"]]
        assert len(pids) >= 3 and all(alive(pid) for pid in pids)  # bwrap, init, shim, server
    finally:
        host.kill()
        host.wait()
        if host.stdout is not None:
            host.stdout.close()
    assert gone(pids, seconds=10)
    for group in said["groups"]:  # what a killed engine leaves; the next site sweeps it later
        Path(group).rmdir()


def test_eval_run_with_sandbox_passes_without_the_callers_environment(tmp_path):
    """`osmosis eval run --sandbox`: the run passes, the rollout never sees GITHUB_TOKEN."""
    rows = [row("pass", a, 3) for a in range(2, 8)]
    make_workspace(
        tmp_path,
        rows,
        main='import os\nassert "GITHUB_TOKEN" not in os.environ, "it reached the rollout"\n'
        + SCRIPTED_MAIN,
    )
    with FakeModelServer() as model:
        env = model_env(model, GITHUB_TOKEN="ghp_callers0token0must0not0leak")
        done = osmosis(
            "--json", "eval", "run", "configs/eval/scripted.toml", "--sandbox", "--yes",
            cwd=tmp_path, env=env,
        )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    resource = json.loads(done.stdout)["resource"]
    assert resource["metrics"]["pass_rate"] == 1.0 and resource["succeeded"] == 6
    log = next((tmp_path / ".osmosis" / "evals").glob("*/logs.txt")).read_text()
    assert "sandbox: bubblewrap" in log


def test_a_sandboxed_run_with_hundreds_of_model_calls_at_once_loses_none(tmp_path):
    """600 rollouts call the bridge at once through the sandbox's forwarders: every call gets
    through (a full listen backlog once refused some, and their attempts failed)."""
    rows = [row("pass", a % 50 + 2, 3) for a in range(600)]
    make_workspace(tmp_path, rows, env={"MAX_CONCURRENT": "600"})
    with FakeModelServer(latency=0.5) as model:
        done = osmosis(
            "--json", "eval", "run", "configs/eval/scripted.toml", "--sandbox", "--yes",
            "--max-in-flight", "600", cwd=tmp_path, env=model_env(model),
        )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    resource = json.loads(done.stdout)["resource"]
    assert resource["succeeded"] == 600, resource


def test_a_venvs_own_pth_lines_never_widen_what_is_bound(tmp_path):
    """A dependency's `.pth` naming a directory (the platform home, say) binds nothing."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    secret_dir = tmp_path / "platform-home"
    secret_dir.mkdir()
    site_packages = next(venv.glob("lib/python3*/site-packages"))
    (site_packages / "evil.pth").write_text(f"{secret_dir}\n")
    bound = interpreter_dirs(venv / "bin" / "python", venv)
    assert venv in bound
    assert not any(p == secret_dir or p in secret_dir.parents for p in bound), bound


async def test_the_rollout_sees_its_checkout_venv_and_outbox_at_fixed_paths(tmp_path):
    """No host path of the run inside: the checkout is /workspace, the venv /venv, the outbox
    /outbox; a traceback names /workspace/rollouts/where/main.py."""
    rollout = write_rollout(
        tmp_path,
        "where",
        'import os, sys\nprint("where:", os.getcwd(), sys.prefix, '
        'os.environ["_OSMOSIS_ROLLOUT_ARTIFACT_ROOT"], os.environ["VIRTUAL_ENV"], __file__, '
        "flush=True)\n" + ROLLOUT,
    )
    (rollout / "pyproject.toml").write_text(
        '[project]\nname = "where"\nversion = "0.1"\nrequires-python = ">=3.11"\n'
        "dependencies = []\n"
    )
    lines: list[str] = []
    site = site_for(rollout, tmp_path, lines)
    await site.start(1)
    await site.stop()
    said = next(line for line in lines if "where:" in line)
    assert said.split("where:", 1)[1].split() == [
        "/workspace/rollouts/where",
        "/venv",
        "/outbox",
        "/venv",
        "/workspace/rollouts/where/main.py",
    ], said
    assert str(tmp_path) not in said
