"""The Ray site's edges that need no cluster: the default path never imports Ray, a missing
extra names its fix, a bridge the nodes cannot reach is refused, where the engine tries a
node's rollout server directly, and `eval run`'s Ray options that cannot work are refused
before anything runs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from osmosis.eval.sites.ray.actor import ReplicaInfo
from osmosis.eval.sites.ray.site import bridge_reach_problem, direct_candidate
from tests.e2e.conftest import model_env
from tests.e2e.workspace import make_workspace, row

CLI = "from osmosis.cli.main import run; run()"


def test_the_default_engine_path_never_imports_ray():
    probe = (
        "import sys\n"
        "import osmosis.cli.main, osmosis.cli.eval, osmosis.eval.host.run, osmosis.eval.engine\n"
        "import osmosis.eval.sites.local, osmosis.platform.worker.run_worker\n"
        "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("bridge", "nodes", "local", "refused"),
    [
        ("http://127.0.0.1:9000", ["127.0.0.1", "127.0.0.1"], "127.0.0.1", False),
        ("http://127.0.0.1:9000", ["10.0.0.5"], "10.0.0.5", False),  # the driver's own node
        ("http://127.0.0.1:9000", ["10.0.0.5", "10.0.0.7"], "10.0.0.5", True),
        ("http://localhost:9000", ["10.0.0.7"], None, True),
        ("http://10.0.0.5:9000", ["10.0.0.5", "10.0.0.7"], "10.0.0.5", False),
    ],
)
def test_a_loopback_bridge_is_refused_when_a_node_is_another_machine(bridge, nodes, local, refused):
    problem = bridge_reach_problem(bridge, nodes, local_ip=local)
    assert (problem is not None) is refused
    if refused:
        assert "10.0.0.7" in problem and "cannot reach" in problem


@pytest.mark.parametrize(
    ("node_ip", "local", "host", "tried"),
    [
        ("127.0.0.1", "127.0.0.1", None, "http://127.0.0.1:8123"),  # a test cluster
        ("10.0.0.5", "10.0.0.5", None, "http://127.0.0.1:8123"),  # the engine's own node
        ("10.0.0.7", "10.0.0.5", None, "http://10.0.0.7:8123"),  # another machine
        ("fd00::7", "10.0.0.5", None, "http://[fd00::7]:8123"),
        ("10.0.0.7", "10.0.0.5", "rollouts.internal", "http://rollouts.internal:8123"),
        ("127.0.0.1", "127.0.0.1", "127.0.0.2", "http://127.0.0.2:8123"),
    ],
)
def test_the_engine_tries_a_nodes_rollout_server_where_it_could_answer(node_ip, local, host, tried):
    info = ReplicaInfo(
        node_id="n" * 56, node_ip=node_ip, hostname="node", base_url="http://127.0.0.1:8123"
    )
    assert direct_candidate(info, local_ip=local, host=host) == tried


def test_ray_options_that_cannot_work_are_refused_naming_the_fix(tmp_path):
    config = make_workspace(tmp_path, [row("pass", i + 2) for i in range(4)], limit=4)
    cases = {
        ("--ray-address", "127.0.0.1:6379"): "--ray-address needs --executor ray",
        ("--executor", "slurm"): "--executor 'slurm': use local or ray",
        ("--executor", "ray", "--sandbox"): "it does not apply to --executor ray",
    }
    for flags, message in cases.items():
        done = subprocess.run(
            [sys.executable, "-c", CLI, "eval", "run", str(config), *flags, "-y", "--json"],
            cwd=tmp_path, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 1, flags
        assert message in json.loads(done.stderr)["error"]["message"], flags
    assert not (tmp_path / ".osmosis").exists()  # nothing was written


@pytest.mark.slow
def test_without_the_ray_extra_eval_run_says_how_to_install_it(tmp_path, fake_model):
    config = make_workspace(tmp_path, [row("pass", i + 2) for i in range(4)], limit=4)
    without_ray = "import sys; sys.modules['ray'] = None  # as if not installed\n" + CLI
    done = subprocess.run(
        [sys.executable, "-c", without_ray, "eval", "run", str(config), "--executor", "ray",
         "-y", "--json"],
        cwd=tmp_path, env=model_env(fake_model), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    error = json.loads(done.stderr)["error"]
    assert error["code"] != "INTERNAL"
    assert "needs the ray package" in error["message"]
    assert "pip install 'osmosis-eval[ray]'" in error["message"]
