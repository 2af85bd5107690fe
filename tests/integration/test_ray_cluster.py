"""A Ray cluster on loopback for tests, and the proof that it stays there.

`RayCluster.start(root)` runs `ray start --block` twice (a head and a second node, distinct
ports, every port below the kernel's ephemeral range) under `strace -f -e trace=connect,...`,
closed to the network as ../shared/reference/machine-notes.md says, plus what measuring
showed it misses:

- `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, `RAY_USAGE_STATS_ENABLED=0`, `RAY_AUTH_MODE=disabled`,
  `--temp-dir` under `root`, `HOME=<root>/home` holding `ray_bootstrap_config.yaml` with
  `provider: {type: local}` (no cloud metadata probe);
- `RAY_USAGE_STATS_REPORT_URL=http://127.0.0.1:9/`: with usage stats *disabled* a `ray start`
  head still reports "disabled" to usage-stats.ray.io (a DNS query to the resolver, then
  HTTPS), measured with strace on Ray 2.60;
- the second node: `ray start` refuses a worker node while
  `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, and with it on it finds its address by a UDP connect
  to 8.8.8.8 and rewrites `127.0.0.1` into the machine's external address. So it is started
  by `_WORKER_NODE` below: the CLI with that one check allowed and the lookup answered
  `127.0.0.1`, while every process it starts keeps `=0`.

The tests at the end start the cluster, run a few attempts on it through the Ray site, and
read the traces: every `connect` goes to 127.0.0.1 or a Unix socket, and nothing is created
or written under the real `$HOME` (nor Ray's default `/tmp/ray`). Other Ray test modules
import `RayCluster` and `ray_cluster` from here.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.ports import free_ports

RAY = Path(sys.executable).parent / "ray"
_WORKER_NODE = """
import sys
import ray._private.ray_constants as constants
import ray._private.services as services
constants.ENABLE_RAY_CLUSTER = True  # the CLI's refusal of a second node; its children keep =0
services.get_node_ip_address = lambda address=None: "127.0.0.1"  # not a UDP probe of 8.8.8.8
from ray.scripts.scripts import main
sys.argv[0] = "ray"
main()
"""
# What strace records: connections, and every call that creates or changes a path.
TRACED = "connect,openat,creat,mkdir,mkdirat,rename,renameat,renameat2,unlink,unlinkat,symlink"
_CONNECT = re.compile(r"connect\(\d+, \{sa_family=(AF_\w+)(.*?)\}, \d+\)")
_ADDRESS = re.compile(r'inet_addr\("([^"]+)"\)|inet_pton\(AF_INET6, "([^"]+)"')
_WRITE_FLAGS = ("O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC", "O_APPEND")
_PATH_CALL = re.compile(r"^\d+\s+(\w+)\((.*)")


def closed_network_env(root: Path, **extra: str) -> dict[str, str]:
    """The environment that keeps Ray on loopback (module doc): for the cluster's processes
    and for every process that connects to it."""
    home = root / "home"
    home.mkdir(parents=True, exist_ok=True)
    (home / "ray_bootstrap_config.yaml").write_text("provider:\n  type: local\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OSMOSIS_", "RAY_"))}
    env.update(
        HOME=str(home),
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        RAY_USAGE_STATS_ENABLED="0",
        RAY_USAGE_STATS_REPORT_URL="http://127.0.0.1:9/",
        RAY_AUTH_MODE="disabled",
        # A dead node is declared within seconds, not half a minute.
        RAY_health_check_period_ms="1000",
        RAY_health_check_failure_threshold="3",
        RAY_health_check_timeout_ms="1000",
        RAY_health_check_initial_delay_ms="1000",
    )
    env.update(extra)
    return env


@dataclass
class RayNode:
    process: subprocess.Popen[bytes]
    temp_dir: Path
    log: Path


@dataclass
class RayCluster:
    """A head and a second node on 127.0.0.1, each in its own process group under strace."""

    root: Path
    env: dict[str, str]
    port: int
    trace_dir: Path
    nodes: list[RayNode] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @classmethod
    def start(cls, root: Path, *, nodes: int = 2, cpus: int = 1, trace: bool = True) -> RayCluster:
        trace_dir = root / "traces"
        trace_dir.mkdir(parents=True)
        ports = free_ports(6 + 7 * nodes + 20 * nodes)
        cluster = cls(
            root=root, env=closed_network_env(root), port=ports.pop(), trace_dir=trace_dir
        )
        try:
            for index in range(nodes):
                args = [
                    "start", "--block", "--node-ip-address", "127.0.0.1",
                    "--temp-dir", str(root / f"ray-{index}"), "--disable-usage-stats",
                    "--num-cpus", str(cpus), "--object-store-memory", str(80 * 1024 * 1024),
                    "--node-manager-port", str(ports.pop()),
                    "--object-manager-port", str(ports.pop()),
                    "--dashboard-agent-listen-port", str(ports.pop()),
                    "--dashboard-agent-grpc-port", str(ports.pop()),
                    "--runtime-env-agent-port", str(ports.pop()),
                    "--metrics-export-port", str(ports.pop()),
                    "--worker-port-list", ",".join(str(ports.pop()) for _ in range(20)),
                ]  # fmt: skip
                if index == 0:
                    command = [str(RAY), *args, "--head", "--port", str(cluster.port)]
                    command += [
                        "--include-dashboard",
                        "false",
                        "--dashboard-port",
                        str(ports.pop()),
                    ]
                else:
                    command = [
                        sys.executable,
                        "-c",
                        _WORKER_NODE,
                        *args,
                        "--address",
                        cluster.address,
                    ]
                cluster._launch(index, command, trace=trace)
                cluster.wait_for_nodes(index + 1)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _launch(self, index: int, command: list[str], *, trace: bool) -> None:
        log = self.root / f"node-{index}.log"
        traced = ["strace", "-f", "--seccomp-bpf", "-qq", "-e", f"trace={TRACED}", "-o"]
        traced += [str(self.trace_dir / f"node-{index}"), *command]
        if not trace:  # bench/ray.py: figures without ptrace's cost
            traced = command
        with log.open("wb") as out:
            process = subprocess.Popen(
                traced, env=self.env, cwd=self.root, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,  # one process group per node: killed as one
            )  # fmt: skip
        self.nodes.append(RayNode(process, self.root / f"ray-{index}", log))

    def wait_for_nodes(self, count: int, *, timeout: float = 120.0) -> None:
        """Until the first `count` nodes say they are up (`ray start` prints it once its
        node is registered; far cheaper than polling `ray status`, which imports Ray)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.process.poll() is not None:
                    raise RuntimeError(f"ray start exited: {node.log.read_text()[-2000:]}")
            if all("Ray runtime started" in n.log.read_text() for n in self.nodes[:count]):
                return
            time.sleep(0.2)
        tail = self.nodes[-1].log.read_text()[-2000:]
        raise RuntimeError(f"{count} Ray nodes did not come up: {tail}")

    def kill_node(self, index: int) -> None:
        """SIGKILL every process of a node at once: its `ray start`, raylet, agents, and the
        workers with their rollout servers (which Ray starts in sessions of their own, so
        a process group is not enough): a machine lost."""
        root = self.nodes[index].process.pid
        for pid in [root, *_descendants(root)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.nodes[index].process.wait(timeout=30)

    def stop(self) -> None:
        """Stop every node (newest first), and make sure no process of theirs is left."""
        for node in reversed(self.nodes):
            if node.process.poll() is None:
                for child in _children(node.process.pid):  # `ray start`: stops its own
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(child, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    node.process.wait(timeout=20)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.process.wait(timeout=20)
        deadline = time.monotonic() + 20
        while (left := self.leftovers()) and time.monotonic() < deadline:
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)

    def leftovers(self) -> list[int]:
        """Processes still running in a node's group or naming this cluster's directory."""
        groups = {node.process.pid for node in self.nodes}
        marker = str(self.root).encode()
        found = []
        for entry in Path("/proc").glob("[0-9]*"):
            try:
                pgid = os.getpgid(int(entry.name))
                cmdline = (entry / "cmdline").read_bytes()
            except (OSError, ProcessLookupError):
                continue
            if pgid in groups or marker in cmdline:
                found.append(int(entry.name))
        return found

    # -- what the traces say ----------------------------------------------------------------
    def trace_files(self) -> list[Path]:
        return sorted(self.trace_dir.iterdir())


def traced_run(
    command: list[str], trace: Path, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    """Run `command` under the same strace as the cluster's nodes."""
    traced = ["strace", "-f", "--seccomp-bpf", "-qq", "-e", f"trace={TRACED}", "-o", str(trace)]
    return subprocess.run([*traced, *command], capture_output=True, text=True, **kwargs)  # type: ignore[call-overload, no-any-return]


def off_loopback_connects(paths: list[Path]) -> list[str]:
    """Every traced `connect` to anything but 127.0.0.1/::1/::ffff:127.0.0.1, a Unix socket
    or netlink, as the trace line says it."""
    found = []
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            match = _CONNECT.search(line)
            if match is None or match.group(1) in ("AF_UNIX", "AF_NETLINK", "AF_UNSPEC"):
                continue
            addresses = [a or b for a, b in _ADDRESS.findall(match.group(2))]
            if not addresses or any(
                a not in ("127.0.0.1", "::1", "::ffff:127.0.0.1") for a in addresses
            ):
                found.append(line.strip())
    return found


def writes_under(paths: list[Path], roots: list[str]) -> list[str]:
    """Traced calls that create, write, rename or remove a path under one of `roots`."""
    found = []
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            match = _PATH_CALL.match(line)
            if match is None or match.group(1) == "connect":
                continue
            call, rest = match.groups()
            if call == "openat" and not any(flag in rest for flag in _WRITE_FLAGS):
                continue
            named = re.findall(r'"([^"]*)"', rest)
            if any(
                n.startswith(root.rstrip("/") + "/") or n == root for n in named for root in roots
            ):
                found.append(line.strip())
    return found


def _descendants(pid: int) -> list[int]:
    """Every process below `pid`, whatever its session or group."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            parents.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found += [int(child) for child in (task / "children").read_text().split()]
    return found


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    """A two-node loopback cluster for one test module, always stopped (checked with /proc)."""
    # Not under pytest's basetemp: Ray's socket paths (<temp>/ray-0/session_<stamp>/sockets/
    # plasma_store) must fit AF_UNIX's 107 bytes, and popen-gwN/ray0/ makes them too long.
    root = Path(tempfile.mkdtemp(prefix="osmosis-ray-", dir="/tmp"))
    cluster = RayCluster.start(root)
    try:
        yield cluster
    finally:
        cluster.stop()
        assert not cluster.leftovers(), f"Ray processes left behind: {cluster.leftovers()}"
        shutil.rmtree(root, ignore_errors=True)


# -- the evidence's own machinery (fast: no cluster) --------------------------------------------
# Lines as strace 6.1 wrote them while a `ray start` head reported to usage-stats.ray.io and
# a worker node probed 8.8.8.8 (before `closed_network_env` and `_WORKER_NODE`).
SEEN = """\
5886  connect(23, {sa_family=AF_INET, sin_port=htons(26379), sin_addr=inet_addr("127.0.0.1")}, 16) = 0
5886  connect(23, {sa_family=AF_INET, sin_port=htons(53), sin_addr=inet_addr("10.255.255.53")}, 16) = 0
9046  connect(15, {sa_family=AF_INET, sin_port=htons(53), sin_addr=inet_addr("8.8.8.8")}, 16) = 0
30032 connect(7, {sa_family=AF_INET6, sin6_port=htons(26379), sin6_flowinfo=htonl(0), inet_pton(AF_INET6, "::ffff:127.0.0.1", &sin6_addr), sin6_scope_id=0}, 28) = -1 EINPROGRESS (Operation now in progress)
30118 connect(20, {sa_family=AF_UNIX, sun_path="/tmp/x/sockets/plasma_store"}, 80) = -1 ENOENT (No such file or directory)
30119 openat(AT_FDCWD, "/root/.ray/auth_token", O_WRONLY|O_CREAT|O_TRUNC|O_CLOEXEC, 0600) = 3
30119 openat(AT_FDCWD, "/root/.bashrc", O_RDONLY|O_CLOEXEC) = 3
30119 mkdir("/tmp/ray/session_1", 0777) = 0
30119 mkdir("/tmp/raylet", 0777) = 0
"""  # noqa: E501


def test_the_trace_readers_catch_what_ray_did_before_it_was_closed_in(tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    trace.write_text(SEEN)
    assert off_loopback_connects([trace]) == [SEEN.splitlines()[1], SEEN.splitlines()[2]]
    writes = writes_under([trace], ["/root", "/tmp/ray"])
    assert writes == [SEEN.splitlines()[5], SEEN.splitlines()[7]]  # a read is no write
