"""RolloutProcess against real child processes on loopback: start, health, logs, death."""

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

from osmosis.eval.results.redact import Redactor
from osmosis.eval.sites.environment import RolloutEnvironment
from osmosis.eval.sites.rollout_process import (
    LOG_PREFIX,
    OFFLINE_DEFAULTS,
    RolloutProcess,
    RolloutStartError,
    child_environment,
)

ROLLOUTS = Path(__file__).parent / "rollouts"
MULTIPLY = Path(__file__).parents[2] / "examples" / "workspace" / "rollouts" / "multiply"
SECRET = "s3cr3t-value-7781"
CURRENT = RolloutEnvironment(
    python=Path(sys.executable), kind="current", cache_key=None, sdk="osmosis"
)


def is_running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (PID 1 here may be slow to reap orphans)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


async def start_chatty(tmp_path: Path, log: Callable[[str], None], **options) -> RolloutProcess:
    options.setdefault("env", {"ROLLOUT_SECRET": SECRET})
    return await RolloutProcess.start(
        CURRENT,
        ROLLOUTS / "chatty",
        "main.py",
        artifact_root=tmp_path / "artifacts",
        log=log,
        redactor=Redactor([SECRET]),
        startup_timeout=15,
        **options,
    )


async def eventually(predicate, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_example_multiply_starts_healthy_and_stops_without_a_trace(tmp_path):
    log: list[str] = []
    process = await RolloutProcess.start(
        CURRENT,
        MULTIPLY,
        "main.py",
        env={},
        artifact_root=tmp_path / "artifacts",
        log=log.append,
        redactor=Redactor([]),
        startup_timeout=30,
    )
    try:
        assert process.alive and is_running(process.pid)
        assert process.base_url == f"http://127.0.0.1:{process.port}"
        health = await process.health()
        assert health["concurrency"]["max_concurrent"] == 4
        assert health["instance_id"] == process.instance_id
    finally:
        returncode = await process.stop()
    assert returncode is not None and not process.alive
    assert not is_running(process.pid)
    assert await process.stop() == returncode  # idempotent
    assert any(line.startswith(LOG_PREFIX) for line in log)


@pytest.mark.parametrize("nothing_to_shut_down", [False, True], ids=["graceful", "at once"])
async def test_a_stop_is_graceful_unless_the_server_said_nothing_runs_on_shutdown(
    tmp_path, nothing_to_shut_down
):
    marker = tmp_path / "terminated"
    env = {"TERM_MARKER": str(marker)}
    if nothing_to_shut_down:
        env["NOTHING_TO_SHUT_DOWN"] = "1"
    process = await start_chatty(tmp_path, [].append, env=env)
    returncode = await process.stop()
    assert not is_running(process.pid)
    if nothing_to_shut_down:  # killed: its SIGTERM handler never ran
        assert returncode == -signal.SIGKILL and not marker.exists()
    else:
        assert returncode == 0 and marker.read_text() == "terminated gracefully"
    assert process.exit_reason == "rollout server 'chatty' was stopped"


async def test_secrets_printed_by_the_rollout_reach_the_log_only_redacted(tmp_path):
    log: list[str] = []
    base_env = dict(os.environ, OPENAI_API_KEY="sk-engine", OSMOSIS_HOME="/x", PLAIN_SETTING="1")
    async with await start_chatty(
        tmp_path,
        log.append,
        env={"ROLLOUT_SECRET": SECRET, "ANTHROPIC_API_KEY": "explicit"},
        base_env=base_env,
    ) as process:
        health = await process.health()
        await eventually(lambda: any("ready to serve" in line for line in log))
    text = "\n".join(log)
    assert SECRET not in text
    assert f"{LOG_PREFIX}starting with secret [REDACTED]" in log
    visible = json.loads(next(line for line in log if "visible" in line).split("visible ", 1)[1])
    # Provider keys and our own variables stay behind unless passed explicitly.
    assert visible == {
        "OPENAI_API_KEY": False,
        "ANTHROPIC_API_KEY": True,
        "OSMOSIS_HOME": False,
        "PLAIN_SETTING": True,
    }
    assert health["artifact_root"] == str((tmp_path / "artifacts").resolve())
    assert health["cwd"] == str((ROLLOUTS / "chatty").resolve())
    assert health["unbuffered"] == "1"


async def test_a_child_that_dies_mid_run_is_noticed(tmp_path):
    process = await start_chatty(tmp_path, [].append)
    try:
        os.kill(process.pid, signal.SIGKILL)
        assert await asyncio.wait_for(process.wait_dead(), 5) == -signal.SIGKILL
        assert process.exited.is_set() and not process.alive
        # The cause, not the last line it printed ("ready to serve" explains nothing).
        assert process.exit_reason == (
            "rollout server 'chatty' exited unexpectedly (code -9, killed by SIGKILL)"
        )
    finally:
        await process.stop()


async def test_a_flood_of_output_and_a_slow_log_never_stall_the_child(tmp_path):
    log: list[str] = []

    def slow_log(line: str) -> None:
        if not log:
            time.sleep(0.5)  # blocks the event loop: the child must keep printing regardless
        log.append(line)

    async with await start_chatty(tmp_path, slow_log, env={"FLOOD_LINES": "100000"}):
        await eventually(lambda: any("ready to serve" in line for line in log))
    assert any("lines dropped: the log could not keep up" in line for line in log)
    assert len(log) < 100_000


async def test_an_entrypoint_that_crashes_at_import_reports_its_traceback(tmp_path):
    with pytest.raises(RolloutStartError) as caught:
        await RolloutProcess.start(
            CURRENT,
            ROLLOUTS / "crash_at_import",
            "main.py",
            env={"ROLLOUT_SECRET": SECRET},
            artifact_root=tmp_path,
            log=[].append,
            redactor=Redactor([SECRET]),
            startup_timeout=15,
        )
    message = str(caught.value)
    assert caught.value.returncode == 1
    assert "exited with code 1" in message
    assert "Traceback (most recent call last)" in message
    assert "RuntimeError: boom: cannot read table with key [REDACTED]" in message
    assert SECRET not in message


def stop_thieves(thief: Path) -> list[int]:
    """Kill the processes that held the ports; the ports they took, in order."""
    ports = [int(line) for line in thief.read_text().split()]
    for port in ports:
        os.kill(int(Path(f"{thief}.{port}").read_text()), signal.SIGKILL)
    return ports


async def test_a_port_taken_before_the_server_bound_it_is_replaced_by_another(tmp_path):
    log: list[str] = []
    thief = tmp_path / "thief"
    try:
        process = await start_chatty(tmp_path, log.append, env={"PORT_THIEF": str(thief)})
        async with process:
            assert (await process.health())["instance_id"] == process.instance_id
    finally:
        taken = stop_thieves(thief)
    assert len(taken) == 1 and process.port != taken[0]
    assert f"rollout server 'chatty': port {taken[0]} was taken before it could listen" in (
        "\n".join(log)
    )


async def test_a_port_taken_at_every_start_ends_after_three_with_the_servers_error(tmp_path):
    thief = tmp_path / "thief"
    try:
        with pytest.raises(RolloutStartError) as caught:
            await start_chatty(
                tmp_path, [].append, env={"PORT_THIEF": str(thief), "PORT_THIEF_ALWAYS": "1"}
            )
    finally:
        taken = stop_thieves(thief)
    assert len(set(taken)) == 3
    assert "Address already in use" in str(caught.value)


async def test_an_entrypoint_that_never_gets_healthy_times_out_and_is_stopped(tmp_path):
    log: list[str] = []
    started = time.monotonic()
    with pytest.raises(
        RolloutStartError, match=r"did not answer GET /health with 200 within 0.5 s"
    ):
        await RolloutProcess.start(
            CURRENT,
            ROLLOUTS / "never_healthy",
            "main.py",
            env={},
            artifact_root=tmp_path,
            log=log.append,
            redactor=Redactor([]),
            startup_timeout=0.5,
        )
    assert time.monotonic() - started < 8
    assert f"{LOG_PREFIX}warming up forever" in log


async def test_a_server_that_says_ready_but_never_listens_does_not_busy_wait_the_engine(
    tmp_path,
):
    cpu = time.process_time()
    with pytest.raises(RolloutStartError, match=r"within 2 s"):
        await RolloutProcess.start(
            CURRENT,
            ROLLOUTS / "ready_never_listens",
            "main.py",
            env={},
            artifact_root=tmp_path,
            log=lambda _: None,
            redactor=Redactor([]),
            startup_timeout=2,
        )
    # A readiness pipe left readable must not spin the event loop for the whole wait: polling
    # every few ms costs a few hundredths of a second of CPU, a spin the full 2 s.
    assert time.process_time() - cpu < 1.0


async def test_a_missing_entrypoint_is_a_start_error(tmp_path):
    with pytest.raises(RolloutStartError, match="does not exist"):
        await RolloutProcess.start(
            CURRENT,
            tmp_path,
            "main.py",
            env={},
            artifact_root=tmp_path,
            log=[].append,
            redactor=Redactor([]),
        )


async def test_an_interpreter_that_cannot_run_is_a_start_error(tmp_path):
    gone = RolloutEnvironment(tmp_path / "no-python", kind="current", cache_key=None, sdk="osmosis")
    with pytest.raises(RolloutStartError, match="cannot execute"):
        await RolloutProcess.start(
            gone,
            ROLLOUTS / "chatty",
            "main.py",
            env={},
            artifact_root=tmp_path,
            log=[].append,
            redactor=Redactor([]),
        )


# The engine as a user runs it: start a rollout, then wait for the run (here: forever).
PARENT = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from osmosis.eval.sites.environment import RolloutEnvironment
    from osmosis.eval.results.redact import Redactor
    from osmosis.eval.sites.rollout_process import RolloutProcess

    async def main():
        env = RolloutEnvironment(Path(sys.executable), "current", None, "osmosis")
        process = await RolloutProcess.start(
            env, Path(sys.argv[1]), "main.py", env={"TERM_MARKER": sys.argv[3]},
            artifact_root=Path(sys.argv[2]), log=lambda line: None, redactor=Redactor([]),
            startup_timeout=15,
        )
        print(process.pid, flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


@pytest.mark.parametrize(
    ("signum", "graceful"),
    [
        (signal.SIGKILL, False),  # no code runs in the parent: the kernel kills the child
        # Ctrl-C: the parent exits and its atexit hook stops the child gracefully.
        pytest.param(signal.SIGINT, True, marks=pytest.mark.slow),
    ],
)
def test_the_child_does_not_outlive_its_parent(tmp_path, signum, graceful):
    marker = tmp_path / "terminated"
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(ROLLOUTS / "chatty"), str(tmp_path), str(marker)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # the KeyboardInterrupt traceback
        text=True,
    )
    try:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        assert is_running(child_pid)
        parent.send_signal(signum)
        parent.wait(10)
        deadline = time.monotonic() + 5
        while is_running(child_pid):
            assert time.monotonic() < deadline, "the rollout outlived its parent"
            time.sleep(0.05)
        assert marker.exists() is graceful
    finally:
        parent.kill()
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()


def test_the_child_environment_keeps_supervisor_variables_authoritative(tmp_path):
    venv = tmp_path / "venv"
    isolated = RolloutEnvironment(
        python=venv / "bin" / "python", kind="uv", cache_key="k", sdk="osmosis"
    )
    child = child_environment(
        base_env={"PATH": "/usr/bin", "PYTHONPATH": "/engine/src", "_OSMOSIS_ROLLOUT_PORT": "1"},
        env={"_OSMOSIS_ROLLOUT_PORT": "2", "OPENAI_API_KEY": "explicit"},
        environment=isolated,
        port=8123,
        artifact_root=tmp_path,
        instance_id="abc",
    )
    assert child == {
        "PATH": f"{venv / 'bin'}:/usr/bin",
        "VIRTUAL_ENV": str(venv),
        "OPENAI_API_KEY": "explicit",
        "_OSMOSIS_ROLLOUT_PORT": "8123",
        "_OSMOSIS_ROLLOUT_ARTIFACT_ROOT": str(tmp_path),
        "_OSMOSIS_ROLLOUT_INSTANCE_ID": "abc",
        "PYTHONUNBUFFERED": "1",
        **OFFLINE_DEFAULTS,
    }


def test_offline_defaults_yield_to_the_environment_and_the_runs_env_table(tmp_path):
    child = child_environment(
        base_env={"DO_NOT_TRACK": "0"},
        env={"LITELLM_LOCAL_MODEL_COST_MAP": "False"},
        environment=CURRENT,
        port=8123,
        artifact_root=tmp_path,
        instance_id="abc",
    )
    assert child["DO_NOT_TRACK"] == "0" and child["LITELLM_LOCAL_MODEL_COST_MAP"] == "False"
    assert child["LITELLM_OFFLINE_MODE"] == "true"
