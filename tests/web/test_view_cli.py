"""`osmosis eval view` as a command: where it looks, what it refuses, and that it only reads
and only answers to loopback names (there is no login)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.platform.conftest import clean_env, free_port
from tests.web.conftest import LocalWorld
from tests.web.local_world import CLI, Viewer

pytestmark = pytest.mark.slow


def view(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "--json", "eval", "view", *args],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def error(done: subprocess.CompletedProcess[str]) -> dict:
    body = json.loads(done.stdout or done.stderr)
    return dict(body["error"])


def test_a_missing_directory_names_where_it_looked(tmp_path: Path):
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    done = view(cwd=tmp_path)
    assert done.returncode == 1
    default = tmp_path.resolve() / ".osmosis" / "evals"
    assert error(done)["message"] == f"no local runs: {default} does not exist"
    done = view("nothing-here", cwd=tmp_path)
    assert done.returncode == 1
    assert error(done)["message"].startswith("no run directory 'nothing-here'")


def test_a_run_name_opens_that_run_from_the_workspace(local_world: LocalWorld):
    viewer = Viewer.start(Path("base"), free_port(), clean_env(), cwd=local_world.evals.parents[1])
    try:
        names = httpx.get(viewer.url + "/", timeout=30).text
        assert 'data-run="base"' in names and 'data-run="candidate"' not in names
    finally:
        output = viewer.stop()
    assert "Viewing run base in " in output and "(read-only)" in output


def test_only_loopback_names_are_answered_and_nothing_is_written(local_world: LocalWorld):
    url = local_world.url
    port = url.rsplit(":", 1)[1]
    rebound = httpx.get(url + "/runs/base", headers={"Host": f"evil.example:{port}"}, timeout=30)
    assert rebound.status_code == 403
    for host in (f"localhost:{port}", f"127.0.0.1:{port}"):
        assert httpx.get(url + "/runs/base", headers={"Host": host}, timeout=30).status_code == 200
    for method, path in (("POST", "/runs/base/stop"), ("POST", "/login"), ("GET", "/secrets")):
        answer = httpx.request(method, url + path, timeout=30)
        assert answer.status_code in (404, 405), (method, path)
    assert httpx.get(url + "/runs/base/files/manifest.json", timeout=30).status_code == 404


def test_a_busy_port_is_refused_and_another_interface_is_a_warning(local_world: LocalWorld):
    busy = local_world.url.rsplit(":", 1)[1]
    done = view(str(local_world.evals), "--port", busy, cwd=local_world.evals)
    assert done.returncode == 1
    refused = error(done)
    assert refused["message"].startswith(f"cannot listen on 127.0.0.1:{busy}")
    assert refused["code"] == "CONFLICT"
    viewer = Viewer.start(local_world.evals, free_port(), clean_env(), "--host", "0.0.0.0")
    try:
        # Asked for explicitly: every name is answered, and the user was told why it matters.
        anywhere = httpx.get(viewer.url + "/", headers={"Host": "box.lan"}, timeout=30)
        assert anywhere.status_code == 200
    finally:
        output = viewer.stop()
    assert "there is no login" in output
