"""The engine's event loop and the rollout servers on CPUs of their own (issue 30): one run's
loop claims a CPU with a lock the kernel drops with the process; a second run finds it taken
and runs as before; the servers keep the rest.

Each case runs in a child process allowed two CPUs (`sched_setaffinity`; one, for the case of
one), with `TMPDIR` (where the locks live) in the test's own directory, so neither the
machine's CPU count beyond two nor another run on it changes the answer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

ALLOWED = sorted(os.sched_getaffinity(0))
LOW, HIGH = ALLOWED[0], ALLOWED[-1]
# A split needs two CPUs to put the loop and the servers on; a machine of one has nothing to
# show here but that nothing is split (which runs anywhere).
two_cpus = pytest.mark.skipif(len(ALLOWED) < 2, reason="a split needs a machine with 2 CPUs")

RESERVE = """
import json, os, sys
os.sched_setaffinity(0, {cpus})
from osmosis.eval.sites import cpu_split
split = cpu_split.reserve()
print(json.dumps(None if split is None else [split.loop_cpu, sorted(split.rollout_cpus)]),
      flush=True)
if sys.argv[1:] == ["hold"]:
    sys.stdin.readline()  # the reservation lasts until the test says
    cpu_split.release()
    print("released", flush=True)
    sys.stdin.readline()
    split = cpu_split.reserve()
    print(json.dumps(None if split is None else split.loop_cpu), flush=True)
    sys.stdin.readline()
"""


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    scratch = tmp_path / "tmp"
    scratch.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS_")}
    return {**env, "TMPDIR": str(scratch), **extra}


def _child(tmp_path: Path, script: str, cpus: set[int] | None = None, **env: str) -> Any:
    """What `script` (formatted with the CPUs it is allowed) prints, as JSON."""
    code = textwrap.dedent(script).format(cpus=cpus or {LOW, HIGH})
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=_env(tmp_path, **env),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout)


def _reserve(tmp_path: Path, cpus: set[int] | None = None, **env: str) -> Any:
    return _child(tmp_path, RESERVE, cpus, **env)


@two_cpus
def test_the_loop_takes_the_higher_cpu_and_the_servers_keep_the_lower(tmp_path):
    assert _reserve(tmp_path) == [HIGH, [LOW]]


def test_nothing_is_reserved_on_one_cpu(tmp_path):
    assert _reserve(tmp_path, cpus={LOW}) is None


@two_cpus
def test_nothing_is_reserved_when_switched_off(tmp_path):
    assert _reserve(tmp_path, OSMOSIS_CPU_SPLIT="off") is None
    assert _reserve(tmp_path) == [HIGH, [LOW]]  # it left nothing behind


@two_cpus
def test_a_second_run_finds_the_cpu_taken_until_the_first_gives_it_back_or_ends(tmp_path):
    code = textwrap.dedent(RESERVE).format(cpus={LOW, HIGH})
    with subprocess.Popen(
        [sys.executable, "-c", code, "hold"],
        env=_env(tmp_path),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as first:
        assert first.stdout is not None and first.stdin is not None
        assert json.loads(first.stdout.readline()) == [HIGH, [LOW]]
        # The lowest CPU is never the loop's, so on two CPUs the second run pins nothing.
        assert _reserve(tmp_path) is None
        first.stdin.write("release\n")
        first.stdin.flush()
        assert first.stdout.readline().strip() == "released"
        assert _reserve(tmp_path) == [HIGH, [LOW]]  # that run has ended: free again
        first.stdin.write("again\n")
        first.stdin.flush()
        assert json.loads(first.stdout.readline()) == HIGH
        assert _reserve(tmp_path) is None
        first.kill()
    assert _reserve(tmp_path) == [HIGH, [LOW]]  # killed: the kernel dropped its lock


@two_cpus
def test_no_reservation_through_a_lock_directory_that_is_not_ours_alone(tmp_path):
    locks = tmp_path / "tmp" / f"osmosis-cpus-{os.getuid()}"
    locks.parent.mkdir()
    locks.write_text("not a directory")
    assert _reserve(tmp_path) is None
    locks.unlink()
    locks.mkdir()
    locks.chmod(0o777)  # anyone could put a lock file of theirs in it
    assert _reserve(tmp_path) is None
    locks.chmod(0o700)
    assert _reserve(tmp_path) == [HIGH, [LOW]]


PLACED = """
import json, os, signal, subprocess, sys, threading
os.sched_setaffinity(0, {cpus})
from osmosis.eval.sites import cpu_split
cpu_split.reserve()
seen = {{}}
# A server started before the dispatch, which has started a process of its own.
tree = ("import subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', "
        "'import time; time.sleep(60)']); print(child.pid, flush=True); time.sleep(60)")
server = subprocess.Popen([sys.executable, "-c", tree], stdout=subprocess.PIPE, text=True,
                          preexec_fn=cpu_split.rollout_hook())
its_child = int(server.stdout.readline())
seen["server before"] = sorted(os.sched_getaffinity(server.pid))
with cpu_split.loop_on_its_cpu(servers=[server.pid]):
    seen["loop"] = sorted(os.sched_getaffinity(0))
    seen["server"] = sorted(os.sched_getaffinity(server.pid))
    seen["its child"] = sorted(os.sched_getaffinity(its_child))
    late = subprocess.run(
        [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
        preexec_fn=cpu_split.rollout_hook(), capture_output=True, text=True, check=True)
    seen["started during"] = json.loads(late.stdout)
    def writer():
        seen["writer before"] = sorted(os.sched_getaffinity(0))
        cpu_split.off_the_loop()
        seen["writer"] = sorted(os.sched_getaffinity(0))
    thread = threading.Thread(target=writer)
    thread.start()
    thread.join()
seen["after"] = sorted(os.sched_getaffinity(0))
os.kill(its_child, signal.SIGKILL)
server.kill()
server.wait()
print(json.dumps(seen))
"""


@two_cpus
def test_servers_run_on_their_cpus_the_loop_on_its_own_and_a_writer_anywhere(tmp_path):
    assert _child(tmp_path, PLACED) == {
        "server before": [LOW, HIGH],  # it starts anywhere: a sandbox's processes in parallel
        "loop": [HIGH],
        "server": [LOW],  # moved when the dispatch begins
        "its child": [LOW],  # and all it started
        "started during": [LOW],  # a replacement starts there
        "writer before": [HIGH],  # a thread inherits its starter's CPUs
        "writer": [LOW, HIGH],
        "after": [LOW, HIGH],  # the dispatch over, the thread is free again
    }


NESTED = """
import json, os, subprocess, sys
os.sched_setaffinity(0, {cpus})
from osmosis.eval.sites import cpu_split
cpu_split.reserve()

def another_process_reserves():
    code = ("import os; os.sched_setaffinity(0, {cpus}); from osmosis.eval.sites import "
            "cpu_split; print(cpu_split.reserve() is not None)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().lower())

first, second = cpu_split.loop_on_its_cpu(), cpu_split.loop_on_its_cpu()
first.__enter__()
second.__enter__()
first.__exit__(None, None, None)
cpu_split.release()  # the first run ends while the second still dispatches
seen = {{"pinned": sorted(os.sched_getaffinity(0)), "free": another_process_reserves()}}
second.__exit__(None, None, None)
cpu_split.release()
seen["after"] = [sorted(os.sched_getaffinity(0)), another_process_reserves()]
print(json.dumps(seen))
"""


@two_cpus
def test_two_runs_on_one_loop_keep_the_cpu_until_the_last_ends(tmp_path):
    assert _child(tmp_path, NESTED) == {
        "pinned": [HIGH],
        "free": False,
        "after": [[LOW, HIGH], True],
    }
