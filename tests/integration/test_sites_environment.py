"""Building a rollout's environment never blocks the run (issue 11, point 6): the build runs
in a thread, and cancelling it (Ctrl-C, `eval stop`) stops uv and its build backend at once,
also while waiting for another run's build of the same environment."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from osmosis.eval.sites.environment import prepare_environment_async

SLOW_BACKEND = """
import os
import time
from pathlib import Path


def _stall(*args, **kwargs):
    Path({mark!r}).write_text(str(os.getpid()))
    time.sleep(600)


get_requires_for_build_wheel = lambda config_settings=None: []
prepare_metadata_for_build_wheel = _stall
build_wheel = _stall
"""


def slow_rollout(root: Path) -> tuple[Path, Path]:
    """A rollout whose one dependency takes ten minutes to build; returns it and the file
    the build backend writes its pid to once it runs."""
    mark = root / "building.pid"
    package = root / "slowpkg"
    package.mkdir()
    (package / "backend.py").write_text(SLOW_BACKEND.format(mark=str(mark)))
    (package / "pyproject.toml").write_text(
        '[project]\nname = "slowpkg"\nversion = "0.1"\n\n'
        '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
    )
    rollout = root / "rollouts" / "slow"
    rollout.mkdir(parents=True)
    (rollout / "main.py").write_text("print('never started')\n")
    (rollout / "pyproject.toml").write_text(
        '[project]\nname = "slow"\nversion = "0.1"\nrequires-python = ">=3.11"\n'
        f'dependencies = ["slowpkg @ {package.as_uri()}"]\n'
    )
    return rollout, mark


def running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and " Z " not in stat.read_text()


async def test_cancelling_a_build_stops_uv_and_a_waiting_run_alike(tmp_path, monkeypatch):
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    rollout, mark = slow_rollout(tmp_path)
    cache = tmp_path / "envs"
    first_log: list[str] = []
    second_log: list[str] = []
    first = asyncio.create_task(
        prepare_environment_async(rollout, cache_root=cache, log=first_log.append)
    )
    deadline = time.monotonic() + 240
    while not (mark.exists() and mark.read_text()):
        assert time.monotonic() < deadline and not first.done(), first_log
        await asyncio.sleep(0.1)
    backend = int(mark.read_text())
    # The event loop is free while uv works: a second run of the same rollout waits its turn.
    second = asyncio.create_task(
        prepare_environment_async(rollout, cache_root=cache, log=second_log.append)
    )
    while not any("waiting for another run" in line for line in second_log):
        assert time.monotonic() < deadline, second_log
        await asyncio.sleep(0.05)

    for task in (second, first):
        began = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert time.monotonic() - began < 10  # not the ten minutes of the build
    await asyncio.sleep(0.3)
    assert not running(backend)  # the build backend died with uv's process group
    assert not list(cache.glob(".build-*"))  # the half-built venv is gone
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []


def test_a_rollouts_links_count_by_target_and_are_never_read_through(tmp_path):
    from osmosis.eval.host.plan import source_digest

    rollout = tmp_path / "rollouts" / "x"
    rollout.mkdir(parents=True)
    (rollout / "main.py").write_text("print('hi')\n")
    secret = tmp_path / "secret.key"
    secret.write_text("first key")
    (rollout / "zero").symlink_to("/dev/zero")  # read through, this never ends
    (rollout / "key").symlink_to(secret)
    os.mkfifo(rollout / "fifo")  # opening it for reading would block
    (rollout / "data").symlink_to(tmp_path, target_is_directory=True)
    began = time.monotonic()
    first = source_digest(rollout)
    assert time.monotonic() - began < 5
    secret.write_text("another key")  # the target's bytes are not part of the sources
    assert source_digest(rollout) == first
    (rollout / "key").unlink()
    (rollout / "key").symlink_to(tmp_path / "elsewhere")  # where a link points is
    assert source_digest(rollout) != first
