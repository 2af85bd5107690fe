"""`eval compare --fail-on-regression` gates on the paired interval of the change, not on row
flips: two runs of one config on a sampling grader pass it, a real drop fails it, and rows
whose attempts disagree within a run are named flaky."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from osmosis.testing import FakeModelServer
from tests.e2e.conftest import model_env, osmosis
from tests.e2e.workspace import SCRIPTED_MAIN, make_workspace, row

pytestmark = pytest.mark.slow

CONFIG = "configs/eval/scripted.toml"
REGRESSION_EXIT = 4
ROWS = 20
N = 4

# A grader that passes each attempt with probability 0.5, seeded by COIN_SEED, the row and
# the attempt's number for that row in this process: the same seed gives the same rewards per
# row whatever order attempts arrive in. With DROP set, rows marked `half` always fail.
COIN_MAIN = SCRIPTED_MAIN.replace(
    """        if kind.startswith("pass_first_"):""",
    """        if kind == "coin":
            import random
            key = ctx.sample.messages[-2]["content"]
            seen[key] += 1
            if ctx.metadata.get("half") and os.environ.get("DROP"):
                ctx.set_reward(0.0)
                return
            coin = random.Random(f"{os.environ['COIN_SEED']}|{key}|{seen[key]}")
            ctx.set_reward(1.0 if coin.random() < 0.5 else 0.0)
            return
        if kind.startswith("pass_first_"):""",
)


def flat(text: str) -> str:
    return " ".join(text.split())


@dataclass
class World:
    workspace: Path
    env: dict[str, str]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return osmosis(*args, cwd=self.workspace, env=self.env)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, fake_model: FakeModelServer) -> Iterator[World]:
    """`noise1` and `noise2`: one config, two grader seeds; `drop`: a third seed with half
    the rows (the even ones) failing every attempt."""
    assert 'kind == "coin"' in COIN_MAIN
    root = tmp_path_factory.mktemp("noise")
    rows = [row("coin", i + 2, 3, half=i % 2 == 0) for i in range(ROWS)]
    make_workspace(root, rows, n=N, main=COIN_MAIN)
    world = World(workspace=root, env=model_env(fake_model))
    for name, extra in (
        ("noise1", {"COIN_SEED": "1"}),
        ("noise2", {"COIN_SEED": "2"}),
        ("drop", {"COIN_SEED": "3", "DROP": "1"}),
    ):
        done = osmosis(
            "eval", "run", CONFIG, "--name", name, "-y", cwd=root, env={**world.env, **extra}
        )
        logs = root / ".osmosis" / "evals" / name / "logs.txt"
        assert done.returncode == 0, done.stdout + done.stderr + logs.read_text()[-3000:]
    yield world


def test_two_runs_of_one_config_on_a_sampling_grader_pass_the_gate(world: World) -> None:
    gated = world.run("eval", "compare", "noise1", "noise2", "--fail-on-regression")
    as_json = world.run("--json", "eval", "compare", "noise1", "noise2", "--fail-on-regression")

    assert gated.returncode == 0, gated.stdout + gated.stderr
    said = flat(gated.stdout + gated.stderr)
    data = json.loads(as_json.stdout)["data"]
    # Row flips happen both ways and stay listed as information, with passes/attempts.
    assert data["regressed_rows"], "the seeds should flip some rows"
    counts = data["differences"][0]["counts"]
    assert counts["regressed"] > 0 and counts["improved"] > 0
    assert "Rows that changed" in said and "noise2: regressed" in said
    assert f"/{N}" in said
    interval = data["differences"][0]["pass_rate"]["interval"]
    assert interval["low"] < 0 < interval["high"]
    assert data["gate"] == {
        "measure": "pass_rate",
        "margin": 0.0,
        "failed": False,
        "regressed_runs": [],
        "ungated_runs": [],
    }
    assert "--fail-on-regression passed" in said
    assert f"{len(data['regressed_rows'])} row flip(s) listed are within noise" in said
    # Flaky rows: attempts that disagree within one run, named per run.
    flaky = data["flaky_rows"]
    assert flaky["noise1"] and flaky["noise2"]
    first = data["rows"][flaky["noise1"][0]]["outcomes"][0]
    assert first["flaky"] is True and 0 < first["passes"] < first["attempts"] == N
    assert "Flaky rows (attempts disagree within a run): noise1: row " in said
    assert " flaky" in gated.stdout
    # `eval info` names the same rows for one run.
    info = json.loads(world.run("--json", "eval", "info", "noise1").stdout)
    assert info["data"]["results"]["flaky_rows"] == flaky["noise1"]
    shown = flat(world.run("eval", "info", "noise1").stdout)
    assert f"Flaky Rows {', '.join(map(str, flaky['noise1'][:3]))}" in shown


def test_a_real_drop_fails_the_gate_naming_the_interval_and_margin(world: World) -> None:
    gated = world.run("eval", "compare", "noise1", "drop", "--fail-on-regression")
    as_json = world.run("--json", "eval", "compare", "noise1", "drop", "--fail-on-regression")

    assert gated.returncode == REGRESSION_EXIT, gated.stdout + gated.stderr
    said = flat(gated.stderr)
    assert "drop regressed against noise1: pass rate change -" in said
    assert "95% CI -" in said
    assert "lies below 0 (--margin 0); exit 4 (--fail-on-regression)" in said
    assert as_json.returncode == REGRESSION_EXIT
    data = json.loads(as_json.stdout)["data"]
    assert data["gate"]["failed"] is True and data["gate"]["regressed_runs"] == ["drop"]
    assert data["differences"][0]["pass_rate"]["interval"]["high"] < 0
    # Rows that always fail in `drop` are not flaky there.
    assert not set(data["flaky_rows"]["drop"]) & set(range(0, ROWS, 2))


def test_margin_tolerates_a_drop_within_it(world: World) -> None:
    data = json.loads(world.run("--json", "eval", "compare", "noise1", "drop").stdout)["data"]
    high = data["differences"][0]["pass_rate"]["interval"]["high"]
    wide = round(-high + 0.05, 2)  # the interval does not lie wholly below -wide

    tolerated = world.run(
        "eval", "compare", "noise1", "drop", "--fail-on-regression", "--margin", str(wide)
    )
    strict = world.run(
        "eval", "compare", "noise1", "drop", "--fail-on-regression", "--margin", "0.01"
    )
    negative = world.run("eval", "compare", "noise1", "drop", "--margin", "-0.1")

    assert tolerated.returncode == 0, tolerated.stdout + tolerated.stderr
    assert f"wholly below -{wide:.1%} (--margin {wide:g})" in flat(
        tolerated.stdout + tolerated.stderr
    )
    assert strict.returncode == REGRESSION_EXIT
    assert "lies below -1.0% (--margin 0.01)" in flat(strict.stderr)
    assert negative.returncode == 2


def test_mean_reward_can_be_the_gated_measure(world: World) -> None:
    noise = world.run(
        "eval", "compare", "noise1", "noise2", "--fail-on-regression", "--measure", "mean-reward"
    )
    drop = world.run(
        "eval", "compare", "noise1", "drop", "--fail-on-regression", "--measure", "mean-reward"
    )

    assert noise.returncode == 0, noise.stdout + noise.stderr
    assert drop.returncode == REGRESSION_EXIT
    assert "drop regressed against noise1: mean reward change -" in flat(drop.stderr)
