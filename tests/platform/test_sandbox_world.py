"""The hostile rollout of the sandbox tests, and helpers to read what it found.

A workspace member's rollout that tries, row by row, what issue 12 found a rollout could do on
the platform, and prints its findings as one `HOSTILE {json}` line to the run's log, where the
tests read them through the API. Every probe is a harmless read, connect or write attempt.

    rows = [hostile_row("probe")]        # looks around: files, /proc, sockets, env, network
    rows = [hostile_row("fork_bomb")]    # and "alloc_4g", "artifact_2g", "link_key", "ok"

(No tests here: the module is named so that it belongs to the sandbox test files.)
"""

from __future__ import annotations

import json
from collections.abc import Iterable

HOSTILE_MAIN = r"""
import asyncio, ctypes, errno, json, os, socket, stat, subprocess, sys
from pathlib import Path

import uvicorn
from osmosis import (AgentWorkflow, AgentWorkflowConfig, ConcurrencyConfig, Grader,
                     LocalBackend, create_rollout_server)

TARGETS = json.loads(os.environ.get("HOSTILE_TARGETS", "[]"))
PORTS = [int(p) for p in json.loads(os.environ.get("HOSTILE_PORTS", "[]"))]
HOST_PIDS = [int(p) for p in json.loads(os.environ.get("HOSTILE_PIDS", "[]"))]
# Values that must show nowhere, given reversed: this very variable must not hold them.
LOOK_FOR = [v[::-1] for v in json.loads(os.environ.get("HOSTILE_LOOK_FOR", "[]"))]


def tried(action):
    try:
        return "ok: " + str(action())[:200]
    except BaseException as error:  # noqa: BLE001 - a probe reports whatever stopped it
        return f"denied: {type(error).__name__}: {error}"[:300]


def read(path):
    p = Path(path)
    if p.is_dir():
        return f"listed {sorted(x.name for x in p.iterdir())[:20]}"
    return f"read {len(p.read_bytes())} bytes"


def connect(host, port):
    with socket.create_connection((host, port), timeout=2):
        return "connected"


def sockets_on_disk():
    found = []
    for top in ("/", ):
        for root, dirs, files in os.walk(top):
            dirs[:] = [d for d in dirs if os.path.join(root, d) not in SKIP_WALK]
            for name in files + dirs:
                path = os.path.join(root, name)
                try:
                    if stat.S_ISSOCK(os.lstat(path).st_mode):
                        found.append(path)
                except OSError:
                    pass
    return found


SKIP_WALK = ("/proc", "/sys", "/dev", "/usr")  # /usr: big, read-only, system packages


def link(fd):
    try:
        return f"{fd}->{os.readlink(f'/proc/self/fd/{fd}')}"
    except OSError:
        return f"{fd}->closed"


def connect_unix(path):
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(2)
        s.connect(path)
        return "connected"


def libc_call(name, *args):
    libc = ctypes.CDLL(None, use_errno=True)
    result = getattr(libc, name)(*args)
    if result != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return result


def probe(ctx):
    found = {"uid": os.getuid(), "cwd": os.getcwd()}
    found["env"] = dict(os.environ)
    found["targets"] = {t: tried(lambda t=t: read(t)) for t in TARGETS}
    pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    found["pids"] = pids
    environs = {}
    for pid in pids:
        try:
            environs[pid] = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
        except OSError as error:
            environs[pid] = f"denied: {error}"
    found["environ_leaks"] = [
        f"{value[:3]}... in /proc/{pid}/environ"
        for value in LOOK_FOR for pid, text in environs.items() if value in text
    ]
    found["host_pids"] = {p: tried(lambda p=p: os.kill(p, 0)) for p in HOST_PIDS}
    found["tcp"] = {
        f"{h}:{p}": tried(lambda h=h, p=p: connect(h, p))
        for p in PORTS for h in ("127.0.0.1", "10.0.2.2")
    }
    found["sockets"] = {s: tried(lambda s=s: connect_unix(s)) for s in sockets_on_disk()}
    found["fds"] = sorted(link(fd) for fd in os.listdir("/proc/self/fd"))
    found["write_workspace"] = tried(lambda: Path("HOSTILE_WAS_HERE").write_text("x"))
    found["write_interpreter"] = tried(
        lambda: Path(sys.executable).with_name("hostile").write_text("x"))
    found["mount"] = tried(lambda: libc_call("mount", b"none", b"/tmp", b"tmpfs", 0, None))
    found["unshare_user"] = tried(lambda: libc_call("unshare", 0x10000000))
    found["sysctl_write"] = {  # opening for writing checks the permission, changes nothing
        path: tried(lambda path=path: os.close(os.open(path, os.O_WRONLY)))
        for path in ("/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches",
                     "/proc/sysrq-trigger", "/proc/sys/kernel/printk")
    }
    status = Path("/proc/self/status").read_text()
    found["cap_eff"] = next(l.split()[1] for l in status.splitlines() if l.startswith("CapEff"))
    found["mounts"] = Path("/proc/self/mountinfo").read_text().count("\n")
    found["interfaces"] = [l.split(":")[0].strip() for l in
                           Path("/proc/net/dev").read_text().splitlines()[2:]]
    found["routes"] = Path("/proc/net/route").read_text().splitlines()[1:]
    found["sys_visible"] = os.path.exists("/sys/fs/cgroup")
    found["home_listing"] = sorted(os.listdir(os.path.expanduser("~")))
    found["root_listing"] = sorted(os.listdir("/"))
    print("HOSTILE " + json.dumps(found), flush=True)


class Hostile(AgentWorkflow):
    async def run(self, ctx):
        kind = ctx.metadata["kind"]
        if kind == "probe":
            await asyncio.to_thread(probe, ctx)
        elif kind == "fork_bomb":
            # Children fork until the kernel says no; each keeps trying.
            subprocess.Popen([sys.executable, "-c",
                "import os, time\n"
                "while True:\n"
                "    try:\n        os.fork()\n"
                "    except OSError:\n        time.sleep(0.01)\n"])
            await asyncio.sleep(30)
        elif kind == "alloc_4g":
            await asyncio.sleep(0.2)
            hog = b"\x01" * (4 << 30)  # touched: 4 GiB resident
            print("allocated", len(hog), flush=True)
        elif kind == "artifact_2g":
            chunk = b"\0" * (1 << 20)
            with open(ctx.artifacts_dir / "big.bin", "wb") as handle:
                for _ in range(2048):
                    handle.write(chunk)
        elif kind == "link_key":
            ctx.artifacts_dir.mkdir(parents=True, exist_ok=True)
            (ctx.artifacts_dir / "notes.txt").write_text("an honest artifact\n")
            os.symlink(os.environ["HOSTILE_KEY_PATH"], ctx.artifacts_dir / "key.txt")
            planted = ctx.artifacts_dir.parent / ".trajectory.json.tmp"  # the worker's temp name
            os.symlink(os.environ["HOSTILE_KEY_PATH"], planted)
        elif kind == "sleep":
            await asyncio.sleep(float(ctx.metadata.get("seconds", 1)))
        reply = await ctx.chat(ctx.prompt)
        if kind == "link_key":  # a secret in the trajectory: the worker redacts it in place
            reply = {**reply, "content": reply["content"] + " " + os.environ["RUN_TOKEN"]}
        return [*ctx.prompt, reply]


class Exact(Grader):
    async def grade(self, ctx):
        import re
        numbers = re.findall(r"-?\d+", str(ctx.sample.messages[-1]["content"]))
        ctx.set_reward(1.0 if numbers and numbers[0] == ctx.label else 0.0)


app = create_rollout_server(backend=LocalBackend(
    workflow=Hostile, grader=Exact,
    workflow_config=AgentWorkflowConfig(
        name="hostile",
        concurrency=ConcurrencyConfig(max_concurrent=int(os.environ.get("MAX_CONCURRENT", "4")))),
))

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]),
                log_level="warning")
"""


def hostile_row(kind: str, a: int = 6, b: int = 7, **extra: object) -> dict:
    return {
        "user_prompt": f"What is {a} * {b}? [{kind}]",
        "ground_truth": str(a * b),
        "metadata": {"kind": kind, **extra},
    }


def hostile_env(
    *,
    targets: Iterable[str] = (),
    ports: Iterable[int] = (),
    pids: Iterable[int] = (),
    look_for: Iterable[str] = (),
    **extra: str,
) -> dict[str, str]:
    """The `[env]` table that tells the hostile rollout where to look (TOML-safe values)."""
    env = {
        "HOSTILE_TARGETS": json.dumps(list(targets)),
        "HOSTILE_PORTS": json.dumps(list(ports)),
        "HOSTILE_PIDS": json.dumps(list(pids)),
        "HOSTILE_LOOK_FOR": json.dumps([value[::-1] for value in look_for]),
        **extra,
    }
    return {name: value.replace("\\", "\\\\").replace('"', '\\"') for name, value in env.items()}


def findings(lines: Iterable[str]) -> dict:
    """The hostile rollout's `HOSTILE {json}` line among the run's log lines."""
    for line in lines:
        _, marker, payload = line.partition("HOSTILE ")
        if marker and payload.startswith("{"):
            return json.loads(payload)
    raise AssertionError("the hostile rollout printed no findings")
