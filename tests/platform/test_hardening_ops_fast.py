"""The pieces behind issue 13's server-operation fixes, in process: the home lock, tightening a
home, and the line of request slots that health skips (the real server: test_hardening_ops)."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from osmosis.platform.core.home_lock import HomeInUse, HomeLock, read_holder
from osmosis.platform.core.request_slots import RequestSlots
from osmosis.private_file import tighten_home


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_a_held_home_lock_refuses_another_naming_pid_and_port_until_released(tmp_path):
    path = tmp_path / "server.lock"
    lock = HomeLock.acquire(path, port=8765, url="http://127.0.0.1:8765")
    assert mode(path) == 0o600
    with pytest.raises(HomeInUse, match=rf"\(pid {os.getpid()}, port 8765\)") as refused:
        HomeLock.acquire(path, port=9000, url="http://127.0.0.1:9000")
    assert refused.value.holder is not None and refused.value.holder.port == 8765
    lock.release()
    assert read_holder(path) is None  # no stale record for readers that do not lock
    HomeLock.acquire(path, port=9000, url="http://127.0.0.1:9000").release()


def test_tightening_a_readable_home_spares_links_and_runs_the_full_walk_once(tmp_path):
    home, outside = tmp_path / "home", tmp_path / "outside"
    (home / "runs" / "r1").mkdir(parents=True)
    outside.mkdir()
    (home / "platform.db").write_text("rows")
    (home / "runs" / "r1" / "logs.txt").write_text("log")
    (outside / "target").write_text("not ours")
    (outside / "shared").write_text("a git object of the user's origin")
    (home / "runs" / "r1" / "link").symlink_to(outside / "target")
    os.link(outside / "shared", home / "runs" / "r1" / "shared")
    for path in (home, home / "runs", home / "runs" / "r1"):
        path.chmod(0o755)
    for path in (home / "platform.db", home / "runs" / "r1" / "logs.txt", outside / "target"):
        path.chmod(0o644)
    (outside / "shared").chmod(0o444)

    tightened = tighten_home(home)
    assert tightened.count == 5 and "." in tightened.examples
    assert [mode(p) for p in (home, home / "runs", home / "runs" / "r1")] == [0o700] * 3
    assert mode(home / "platform.db") == mode(home / "runs" / "r1" / "logs.txt") == 0o600
    assert mode(outside / "target") == 0o644 and mode(outside / "shared") == 0o444

    # Marked: later starts check the home and its top level only.
    (home / "runs" / "r1" / "logs.txt").chmod(0o644)
    (home / "platform.db").chmod(0o644)
    assert tighten_home(home).count == 1
    assert mode(home / "platform.db") == 0o600
    assert mode(home / "runs" / "r1" / "logs.txt") == 0o644


async def test_requests_beyond_the_slots_wait_in_line_and_health_does_not():
    app = FastAPI()
    release = asyncio.Event()
    inside = 0

    @app.get("/slow")
    async def slow() -> dict[str, int]:
        nonlocal inside
        inside += 1
        await release.wait()
        return {"inside": inside}

    @app.get("/api/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    app.add_middleware(RequestSlots, slots=1, exempt={"/api/health"})
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        first = asyncio.create_task(client.get("/slow"))
        second = asyncio.create_task(client.get("/slow"))
        await asyncio.sleep(0.1)
        assert inside == 1  # the second waits for the slot, it is not refused
        assert (await client.get("/api/health")).status_code == 200  # while the slot is held
        release.set()
        answers = await asyncio.gather(first, second)
    assert [a.status_code for a in answers] == [200, 200] and inside == 2
