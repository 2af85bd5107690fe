"""A rollout's environment is built inside the sandbox: its own build backend, run by uv, finds
nothing of the host and reaches only the package index.

Real uv, real bubblewrap, offline: the package index is a PEP 503 page served on loopback (the
operator's `OSMOSIS_PACKAGE_INDEX`), reached through the build's package proxy. The hostile
project has `dynamic = ["dependencies"]` and an in-tree backend (`backend-path = ["."]`), as in
the finding: while uv builds it, the backend tries the platform's secret key, its database,
every `/proc/*/environ`, the operator's variables, the platform's port (directly and through
the proxy) and the files of another workspace, then ships what it found inside the wheel.
"""

import json
import os
import socket
import textwrap
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from osmosis.eval.sites import environment as environment_module
from osmosis.eval.sites.environment import RolloutEnvironmentError, prepare_environment
from osmosis.eval.sites.sandbox.build import BuildSandbox
from osmosis.eval.sites.sandbox.package_index import PackageIndex
from osmosis.eval.sites.sandbox.policy import SandboxPolicy

from .test_environment_hostile import site_packages, wheel

MARKER = "MARKER-operator-secret-41c9"

BACKEND = '''\
"""A build backend that looks around while it builds (the hostile part), then builds."""
import base64, hashlib, json, os, socket, zipfile

HERE = os.path.dirname(os.path.abspath(__file__))


def _probe():
    with open(os.path.join(HERE, "targets.json")) as handle:
        targets = json.load(handle)
    found = {"files": {}, "environ": [], "proc": [], "tcp": {}, "proxy": {}}
    for path in targets["files"]:
        try:
            with open(path, "rb") as handle:
                found["files"][path] = "READ " + handle.read(200).decode(errors="replace")
        except OSError as error:
            found["files"][path] = "denied: " + type(error).__name__
    found["environ"] = [k for k, v in os.environ.items() if targets["marker"] in v]
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/environ", "rb") as handle:
                    if targets["marker"].encode() in handle.read():
                        found["proc"].append(pid)
            except OSError:
                pass
    for port in targets["ports"]:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            found["tcp"][str(port)] = "CONNECTED"
        except OSError as error:
            found["tcp"][str(port)] = "denied: " + type(error).__name__
        proxy = os.environ.get("HTTPS_PROXY", "")
        if proxy.startswith("http://"):
            host, _, proxy_port = proxy[len("http://"):].rstrip("/").rpartition(":")
            try:
                with socket.create_connection((host, int(proxy_port)), timeout=5) as conn:
                    conn.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\\r\\n\\r\\n".encode())
                    found["proxy"][str(port)] = conn.recv(100).decode().split("\\r\\n")[0]
            except OSError as error:
                found["proxy"][str(port)] = "no proxy: " + type(error).__name__
    found["cwd"] = os.getcwd()
    found["root"] = sorted(os.listdir("/"))
    return found


def _wheel(directory, files, requires):
    dist = "hostile-0.1.dist-info"
    entries = dict(files)
    entries[dist + "/METADATA"] = (
        "Metadata-Version: 2.1\\nName: hostile\\nVersion: 0.1\\n"
        + "".join(f"Requires-Dist: {r}\\n" for r in requires)
    )
    entries[dist + "/WHEEL"] = (
        "Wheel-Version: 1.0\\nGenerator: hostile\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"
    )
    record = []
    for path, text in entries.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    entries[dist + "/RECORD"] = "\\n".join(record + [dist + "/RECORD,,"]) + "\\n"
    name = "hostile-0.1-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(directory, name), "w") as archive:
        for path, text in entries.items():
            archive.writestr(path, text)
    return name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    found = json.dumps(_probe())
    print("hostile backend found:", found, flush=True)
    return _wheel(wheel_directory, {"hostile_findings.json": found}, ["victim>=1.0"])


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return build_wheel(wheel_directory, config_settings, metadata_directory)
'''

PYPROJECT = """\
[project]
name = "hostile"
version = "0.1"
requires-python = ">=3.11"
dynamic = ["dependencies"]

[build-system]
requires = []
build-backend = "backend"
backend-path = ["."]
"""


@pytest.fixture
def index(tmp_path):
    """A PEP 503 index on loopback holding `victim` 1.0: the operator's package index."""
    root = tmp_path / "index"
    files = root / "files"
    wheel(files, "victim", "1.0", {"victim/__init__.py": "VERSION = '1.0'\n"})
    page = root / "simple" / "victim"
    page.mkdir(parents=True)
    (page / "index.html").write_text(
        '<html><body><a href="/files/victim-1.0-py3-none-any.whl">'
        "victim-1.0-py3-none-any.whl</a></body></html>\n"
    )
    server = ThreadingHTTPServer(
        ("127.0.0.1", 0), partial(SimpleHTTPRequestHandler, directory=str(root))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    server.shutdown()
    server.server_close()


@pytest.fixture
def platform_port():
    """A port standing for the platform's API: listening on the host's loopback."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    yield listener.getsockname()[1]
    listener.close()


@pytest.fixture
def hostile(tmp_path, monkeypatch, platform_port):
    """The platform's home (key, database), another workspace's file, the operator's
    variable, and the hostile rollout naming them all as its targets."""
    home = tmp_path / "platform-home"
    home.mkdir()
    (home / "secret.key").write_text(f"key {MARKER}\n")
    (home / "platform.db").write_text(f"database {MARKER}\n")
    other = tmp_path / "other-workspace" / "rollouts" / "x"
    other.mkdir(parents=True)
    (other / "main.py").write_text(f"# {MARKER}\n")
    monkeypatch.setenv("OSMOSIS_DATABASE_URL", f"postgresql://admin:{MARKER}@db/osmosis")
    monkeypatch.setenv("OSMOSIS_ADMIN_TOKEN", MARKER)
    # Our SDK is not what this test is about: no download of its dependencies.
    monkeypatch.setattr(environment_module, "_our_requirement", lambda rollout: None)
    checkout = tmp_path / "checkout"
    rollout = checkout / "rollouts" / "hostile"
    rollout.mkdir(parents=True)
    (rollout / "main.py").write_text("import hostile_findings\n")
    (rollout / "pyproject.toml").write_text(PYPROJECT)
    (rollout / "backend.py").write_text(BACKEND)
    targets = {
        "files": [
            str(home / "secret.key"),
            str(home / "platform.db"),
            str(other / "main.py"),
            str(Path.home() / ".bash_history"),
        ],
        "ports": [platform_port],
        "marker": MARKER,
    }
    (rollout / "targets.json").write_text(json.dumps(targets))
    return checkout, rollout


def sandbox_for(index_url: str) -> BuildSandbox:
    return BuildSandbox.for_policy(
        SandboxPolicy(), environ={"OSMOSIS_PACKAGE_INDEX": index_url, "PATH": os.environ["PATH"]}
    )


def findings(venv: Path) -> dict:
    return json.loads((site_packages(venv) / "hostile_findings.json").read_text())


def test_a_hostile_build_backend_in_the_sandbox_finds_nothing_and_reaches_only_the_index(
    tmp_path, hostile, index, platform_port
):
    checkout, rollout = hostile
    log: list[str] = []
    env = prepare_environment(
        rollout,
        cache_root=tmp_path / "envs",
        log=log.append,
        scope="workspace:1",
        checkout=checkout,
        sandbox=sandbox_for(index),
    )
    assert env.venv is not None
    found = findings(env.venv)
    print(json.dumps(found, indent=2))  # what the backend tried, for the reader of the log
    assert all(v.startswith("denied") for v in found["files"].values()), found["files"]
    assert found["environ"] == [] and found["proc"] == []
    assert found["tcp"] == {str(platform_port): "denied: ConnectionRefusedError"}
    # Through the proxy: refused, it is not the index.
    assert found["proxy"][str(platform_port)].startswith("HTTP/1.1 403"), found["proxy"]
    assert found["cwd"] == "/venv/osmosis-rollout-source"  # the build's copy, at the jail's path
    assert not {"var", "srv", "mnt", "opt"} & set(found["root"]), found["root"]
    # The dependency came from the operator's index, through the proxy.
    assert (site_packages(env.venv) / "victim" / "__init__.py").is_file()
    assert any("building in the sandbox" in line for line in log), log
    assert any(f"refused a connection to 127.0.0.1:{platform_port}" in line for line in log), log


def test_the_same_backend_on_the_host_finds_the_secrets(tmp_path, hostile, index):
    """What the sandbox takes away: without it (`eval run` of one's own code), the same build
    reads the key and the operator's variables: the test above is not vacuous."""
    checkout, rollout = hostile
    os.environ["UV_DEFAULT_INDEX"] = index
    try:
        env = prepare_environment(
            rollout, cache_root=tmp_path / "envs", log=lambda line: None, checkout=checkout
        )
    finally:
        del os.environ["UV_DEFAULT_INDEX"]
    assert env.venv is not None
    found = findings(env.venv)
    assert found["files"][str(tmp_path / "platform-home" / "secret.key")].startswith("READ")
    assert "OSMOSIS_ADMIN_TOKEN" in found["environ"]


def test_a_failing_sandboxed_build_shows_no_host_path_and_no_host_content(tmp_path, hostile, index):
    """A backend that raises with what it read: the error holds uv's lines with the jail's
    paths (`/workspace`, `<venv>`), never the checkout's or the cache's host paths."""
    checkout, rollout = hostile
    (rollout / "backend.py").write_text(
        BACKEND
        + textwrap.dedent(
            """
            def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
                raise RuntimeError("found: " + json.dumps(_probe()))
            """
        )
    )
    with pytest.raises(RolloutEnvironmentError) as caught:
        prepare_environment(
            rollout,
            cache_root=tmp_path / "envs",
            log=lambda line: None,
            scope="workspace:1",
            checkout=checkout,
            sandbox=sandbox_for(index),
        )
    shown = str(caught.value)
    assert "found:" in shown  # the backend's own words are there…
    assert MARKER not in shown  # …but nothing it could have read
    assert str(checkout) not in shown and str(tmp_path / "envs") not in shown
    assert "<venv>/osmosis-rollout-source" in shown


def test_each_scope_builds_with_a_uv_cache_of_its_own(tmp_path, hostile, index):
    checkout, rollout = hostile
    for scope in ("workspace:1", "workspace:2"):
        prepare_environment(
            rollout,
            cache_root=tmp_path / "envs",
            log=lambda line: None,
            scope=scope,
            checkout=checkout,
            sandbox=sandbox_for(index),
        )
    caches = sorted((tmp_path / "envs" / ".uv-cache").iterdir())
    assert len(caches) == 2 and all(any(cache.iterdir()) for cache in caches)


@pytest.mark.parametrize(
    ("environ", "hosts"),
    [
        ({}, {("pypi.org", 443), ("files.pythonhosted.org", 443)}),
        ({"UV_DEFAULT_INDEX": "https://mirror.example:8443/simple"}, {("mirror.example", 8443)}),
        (
            {"UV_INDEX": "internal=https://pkgs.example/simple", "UV_DEFAULT_INDEX": "http://a/s"},
            {("pkgs.example", 443), ("a", 80)},
        ),
        (
            {"OSMOSIS_PACKAGE_INDEX": "https://only.example/simple", "UV_INDEX_URL": "http://x/"},
            {("only.example", 443)},
        ),
    ],
)
def test_the_index_is_the_operators_or_uvs_default(environ, hosts):
    assert PackageIndex.from_environment(environ).hosts == hosts
