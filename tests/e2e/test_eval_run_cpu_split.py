"""`osmosis eval run` keeps its event loop and its rollout servers on CPUs of their own while it
dispatches (issue 30), whether the server was started at the command's entry or by the site;
switched off, on one CPU, or with the CPU taken by another run, everything runs where the
scheduler puts it.

The rollout reports, from inside an attempt, the CPUs its own process may use and those of
the engine's event loop (its parent's main thread, `/proc/<ppid>/status`). The command is
allowed two CPUs, and `TMPDIR` (where the CPU locks live) is the test's own.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.e2e.conftest import CLI, model_env
from tests.e2e.workspace import SCRIPTED_MAIN, make_workspace, row

ALLOWED = sorted(os.sched_getaffinity(0))
LOW, HIGH = ALLOWED[0], ALLOWED[-1]
pytestmark = pytest.mark.slow
# A split needs two CPUs; on a machine of one only "nothing is split" can be shown.
two_cpus = pytest.mark.skipif(len(ALLOWED) < 2, reason="a split needs a machine with 2 CPUs")

CHAT = "        reply = await ctx.chat(ctx.prompt)\n"
PROBE = """        server = sorted(os.sched_getaffinity(0))
        status = Path(f"/proc/{os.getppid()}/status").read_text()
        loop = next(line.split(":", 1)[1].strip() for line in status.splitlines()
                    if line.startswith("Cpus_allowed_list"))
        if os.environ.get("CPU_REPORT"):  # not in the sandbox: the reply says it there
            with open(os.environ["CPU_REPORT"], "a") as report:
                report.write(json.dumps({"server": server, "loop": loop}) + "\\n")
"""
RETURN = "        return [*ctx.prompt, reply]\n"
SAY = """        reply = {**reply, "content": reply["content"] + f" cpus={server}"}\n"""
PROBE_MAIN = "import json\n" + SCRIPTED_MAIN.replace(CHAT, PROBE + CHAT, 1).replace(
    RETURN, SAY + RETURN, 1
)
assert PROBE in PROBE_MAIN and SAY in PROBE_MAIN


def _cpus(listed: str) -> list[int]:
    """`0-1,3` as [0, 1, 3] (the kernel's list format)."""
    cpus: list[int] = []
    for part in listed.split(","):
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


def _run(tmp_path: Path, fake_model, *extra: str, cpus: set[int], **env: str) -> list[dict]:
    config = make_workspace(tmp_path / "ws", [row("pass", a) for a in range(2, 6)], main=PROBE_MAIN)
    report = tmp_path / "cpus.jsonl"
    (tmp_path / "tmp").mkdir(exist_ok=True)
    done = subprocess.run(
        [*CLI, "eval", "run", str(config), "--name", "cpus", "-y", "--json", *extra],
        cwd=config.parents[2],
        env=model_env(fake_model, TMPDIR=str(tmp_path / "tmp"), CPU_REPORT=str(report), **env),
        preexec_fn=lambda: os.sched_setaffinity(0, cpus),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["resource"]["outcomes"]["passed"] == 4
    seen = [json.loads(line) for line in report.read_text().splitlines()]
    assert len(seen) == 4
    logs = (config.parents[2] / ".osmosis" / "evals" / "cpus" / "logs.txt").read_text()
    return [{"server": s["server"], "loop": _cpus(s["loop"]), "logs": logs} for s in seen]


@two_cpus
@pytest.mark.parametrize(
    "extra",
    [(), ("--replicas", "2")],  # the server started at the entry; two started by the site
    ids=["early-server", "two-servers"],
)
def test_the_loop_and_the_servers_run_on_cpus_of_their_own(tmp_path, fake_model, extra):
    attempts = _run(tmp_path, fake_model, *extra, cpus={LOW, HIGH})
    # Both ways a server starts are covered: at the command's entry, or by the site.
    assert ("started at the command's entry" in attempts[0]["logs"]) == (not extra)
    for attempt in attempts:
        assert attempt["server"] == [LOW]
        assert attempt["loop"] == [HIGH]
        assert (
            f"the engine's event loop runs on CPU {HIGH}, the rollout servers on CPU {LOW}"
            in (attempt["logs"])
        )


@two_cpus
def test_switched_off_everything_runs_where_the_scheduler_puts_it(tmp_path, fake_model):
    for attempt in _run(tmp_path, fake_model, cpus={LOW, HIGH}, OSMOSIS_CPU_SPLIT="off"):
        assert attempt["server"] == attempt["loop"] == [LOW, HIGH]
        assert "event loop runs on CPU" not in attempt["logs"]


def test_on_one_cpu_nothing_is_split(tmp_path, fake_model):
    for attempt in _run(tmp_path, fake_model, cpus={LOW}):
        assert attempt["server"] == attempt["loop"] == [LOW]


@two_cpus
def test_a_cpu_another_run_holds_is_not_shared(tmp_path, fake_model):
    locks = tmp_path / "tmp" / f"osmosis-cpus-{os.getuid()}"
    locks.mkdir(parents=True, mode=0o700)
    with open(locks / f"cpu-{HIGH}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # what another run's engine holds while it runs
        for attempt in _run(tmp_path, fake_model, cpus={LOW, HIGH}):
            assert attempt["server"] == attempt["loop"] == [LOW, HIGH]


@two_cpus
def test_a_sandboxed_server_runs_on_the_servers_cpus(tmp_path, fake_model):
    """Moved from outside, through bwrap's namespaces: the rollout says its CPUs in its reply
    (it cannot write files there), which the trajectory keeps."""
    config = make_workspace(tmp_path / "ws", [row("pass", a) for a in range(2, 6)], main=PROBE_MAIN)
    # A short TMPDIR of its own: the sandbox's Unix sockets live there (108-byte paths).
    with tempfile.TemporaryDirectory(prefix="cpus-") as scratch:
        done = subprocess.run(
            [*CLI, "eval", "run", str(config), "--name", "boxed", "-y", "--json", "--sandbox"],
            cwd=config.parents[2],
            env=model_env(fake_model, TMPDIR=scratch),
            preexec_fn=lambda: os.sched_setaffinity(0, {LOW, HIGH}),
            capture_output=True,
            text=True,
            timeout=180,
        )
    assert done.returncode == 0, done.stderr
    run_dir = config.parents[2] / ".osmosis" / "evals" / "boxed"
    said = [
        re.findall(r"cpus=\[([0-9, ]*)\]", path.read_text())
        for path in sorted((run_dir / "trajectories").glob("*.json"))
    ]
    assert len(said) == 4
    assert all(cpus and set(cpus) == {str(LOW)} for cpus in said), said
    assert f"the engine's event loop runs on CPU {HIGH}" in (run_dir / "logs.txt").read_text()
