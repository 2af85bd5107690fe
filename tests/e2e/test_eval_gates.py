"""What a CI job sees: `eval compare` on real run directories, gates and their exit codes,
`--report`/`--junit` (validated against the JUnit schema), progress without a terminal,
and the resume and retry commands printed after Ctrl-C and failures."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree

import pytest
import xmlschema

from osmosis.testing import FakeModelServer
from tests.e2e.conftest import CLI, model_env, osmosis
from tests.e2e.workspace import make_workspace, row

pytestmark = pytest.mark.slow

JUNIT_XSD = Path(__file__).parent / "schemas" / "junit.xsd"
CONFIG = "configs/eval/scripted.toml"
GATE_EXIT, REGRESSION_EXIT, ERRORED_EXIT = 3, 4, 5

# Rows 1 and 4 pass until BREAK_GRADER breaks their grader; row 3 is always wrong.
ROWS = [
    row("pass", 2, 2),
    row("breakable", 3, 3),
    row("pass", 4, 4),
    {**row("wrong", 5, 5), "ground_truth": "0"},
    row("breakable", 6, 6),
    row("pass", 7, 7),
]


def flat(text: str) -> str:
    """Output with the terminal's line wrapping undone."""
    return " ".join(text.split())


@dataclass
class World:
    workspace: Path
    config: Path
    env: dict[str, str]

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return osmosis(*args, cwd=self.workspace, env={**self.env, **env})

    def eval_run(self, name: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        # The config as a user types it in the workspace: the printed commands repeat it.
        return self.run("eval", "run", CONFIG, "--name", name, "-y", *args, **env)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, fake_model: FakeModelServer) -> Iterator[World]:
    """A workspace with two finished runs of the same rows: `base` (5 of 6 pass) and
    `broken` (rows 1 and 4 failed with a grader error: 3 of 6)."""
    root = tmp_path_factory.mktemp("gates")
    config = make_workspace(root, ROWS, limit=6)
    world = World(workspace=root, config=config, env=model_env(fake_model))
    for name, env in (("base", {}), ("broken", {"BREAK_GRADER": "1"})):
        done = world.eval_run(name, **env)
        logs = root / ".osmosis" / "evals" / name / "logs.txt"
        assert done.returncode == 0, done.stdout + done.stderr + logs.read_text()[-3000:]
        if name == "broken":
            world.broken_output = done.stdout + done.stderr  # type: ignore[attr-defined]
    yield world


# -- compare ---------------------------------------------------------------------------------
def test_compare_names_the_regressed_rows_and_gates_on_the_interval(world: World) -> None:
    plain = world.run("eval", "compare", "base", "broken")
    gated = world.run("eval", "compare", "base", "broken", "--fail-on-regression")
    as_json = world.run("--json", "eval", "compare", "base", "broken")

    assert plain.returncode == 0, plain.stderr
    # 2 flips of 6 rows: the interval of the change spans 0, so the gate passes and the rows
    # stay listed (tests/e2e/test_eval_compare_noise.py has a drop that fails it).
    assert gated.returncode == 0, gated.stderr
    assert "2 row flip(s) listed are within noise" in flat(gated.stdout + gated.stderr)
    assert "broken: regressed" in plain.stdout
    data = json.loads(as_json.stdout)["data"]
    assert data["regressed_rows"] == [1, 4]
    difference = data["differences"][0]
    assert difference["counts"] == {"regressed": 2, "improved": 0, "same": 4, "missing": 0}
    pass_rate = difference["pass_rate"]
    assert (pass_rate["baseline"], pass_rate["other"]) == (5 / 6, 3 / 6)
    interval = pass_rate["interval"]
    assert interval["estimate"] == pytest.approx(-2 / 6)
    assert interval["method"] == "newcombe_paired"  # 6 rows: no bootstrap
    assert interval["low"] < -2 / 6 < interval["high"]


def test_compare_of_a_run_with_itself_finds_nothing_and_passes_the_gate(world: World) -> None:
    done = world.run("eval", "compare", "base", "base", "--fail-on-regression")

    assert done.returncode == 0, done.stderr
    assert "No row changed its pass rate." in done.stdout + done.stderr


def test_compare_refuses_runs_of_other_rows_unless_told(world: World) -> None:
    assert world.eval_run("subset", "--rows", "0-2").returncode == 0

    refused = world.run("eval", "compare", "base", "subset")
    allowed = world.run("eval", "compare", "base", "subset", "--allow-mismatch")
    as_json = world.run("--json", "eval", "compare", "base", "subset")

    assert refused.returncode == 1
    said = flat(refused.stderr)
    assert "not comparable row for row (2 difference(s))" in said
    assert "selected rows differ: base and subset ran different rows" in said
    assert "rows differ: 3 only in base (3, 4, 5)" in said
    assert "--allow-mismatch" in said
    assert allowed.returncode == 0, allowed.stderr
    assert "warning: selected rows differ" in flat(allowed.stderr)
    error = json.loads(as_json.stderr)["error"]
    assert error["code"] == "VALIDATION" and len(error["details"]["problems"]) == 2


def test_compare_accepts_directories_and_names_an_unknown_run(world: World) -> None:
    base_dir = world.workspace / ".osmosis" / "evals" / "base"
    done = world.run("--json", "eval", "compare", str(base_dir), "broken")
    missing = world.run("eval", "compare", "base", "no-such-run")

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["data"]["runs"] == [str(base_dir), "broken"]
    assert missing.returncode == 1
    assert "run 'no-such-run' not found" in flat(missing.stderr)


# -- gates -----------------------------------------------------------------------------------
def test_min_pass_rate_and_min_mean_reward_gate_with_their_own_exit_code(world: World) -> None:
    # Re-running a complete run dispatches nothing; its recorded results are gated.
    below = world.eval_run("broken", "--min-pass-rate", "0.9")
    above = world.eval_run("base", "--min-pass-rate", "0.8", "--min-mean-reward", "0.8")
    reward = world.eval_run("base", "--json", "--min-mean-reward", "0.9")

    assert below.returncode == GATE_EXIT
    assert "gate failed: pass rate 50.0% < 90.0% (--min-pass-rate)" in flat(below.stderr)
    assert above.returncode == 0, above.stderr
    assert "gate passed: pass rate 83.3% >= 80.0% (--min-pass-rate)" in flat(above.stdout)
    assert reward.returncode == GATE_EXIT
    resource = json.loads(reward.stdout)["resource"]
    assert resource["gates"] == [
        {"flag": "--min-mean-reward", "threshold": 0.9, "value": 5 / 6, "passed": False}
    ]
    assert resource["gates_passed"] is False


def test_bad_gate_values_are_refused_before_anything_runs(world: World) -> None:
    done = world.eval_run("never", "--min-pass-rate", "80", "--min-mean-reward", "nan")

    assert done.returncode == 1
    assert "--min-pass-rate must be between 0 and 1" in flat(done.stderr)
    assert "--min-mean-reward must be a finite number" in flat(done.stderr)
    assert not (world.workspace / ".osmosis" / "evals" / "never").exists()


# -- report and JUnit ------------------------------------------------------------------------
def test_report_and_junit_describe_every_row(world: World, tmp_path: Path) -> None:
    report, junit = tmp_path / "ci" / "report.md", tmp_path / "ci" / "junit.xml"

    done = world.eval_run("broken", "--report", str(report), "--junit", str(junit))

    assert done.returncode == 0, done.stderr
    schema = xmlschema.XMLSchema(JUNIT_XSD)
    schema.validate(str(junit))  # raises, naming the element, when it does not conform
    suite = ElementTree.parse(junit).getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("6", "1", "2")
    # Each case names its row's input and expected answer, as a CI page lists them.
    cases = {case.get("name", "").split(":")[0]: case for case in suite.iter("testcase")}
    assert list(cases) == [f"row {i}" for i in range(6)]
    assert cases["row 1"].get("name") == "row 1: What is 3 * 3? [breakable] → 9"
    assert cases["row 3"].get("name") == "row 3: What is 5 * 5? [wrong] → 0"
    assert [c.tag for c in cases["row 1"]] == ["error", "system-out"]
    assert cases["row 1"].find("error").get("type") == "agent_error"  # type: ignore[union-attr]
    assert "broken on purpose" in (cases["row 1"].find("error").text or "")  # type: ignore[union-attr]
    assert cases["row 3"].find("failure") is not None
    assert cases["row 0"].find("failure") is None and cases["row 0"].find("error") is None
    text = report.read_text()
    assert text.startswith("## osmosis eval run `broken`: finished")
    assert "| Pass rate | 50.0% (3/6 scored, threshold 1) — 95% CI 18.8% to 81.2% (wilson) |" in (
        text
    )
    assert "### Errored attempts (2)" in text
    assert "| 1 | 0 | agent_error |" in text and "| What is 3 * 3? [breakable] | 9 |" in text
    # The wrong answer is listed with what it answered, what was asked and what was expected.
    assert "### Not passed attempts (1)" in text
    (wrong,) = [line for line in text.splitlines() if line.startswith("| 3 | 0 | 0 |")]
    assert wrong.endswith("| What is 5 * 5? [wrong] | 0 |") and "25" in wrong
    assert "complete: 3 passed, 1 not passed, 2 errored, 0 skipped" in text
    assert "| 1 | 0 | agent_error |" in text
    assert "--retry-failed" in text


def test_a_junit_file_that_breaks_the_schema_is_caught(tmp_path: Path) -> None:
    # The validator is real: a test case without a name does not pass.
    bad = tmp_path / "bad.xml"
    bad.write_text(
        '<testsuites><testsuite name="x" tests="1" failures="0" errors="0">'
        "<testcase/></testsuite></testsuites>"
    )

    with pytest.raises(xmlschema.XMLSchemaValidationError, match="name"):
        xmlschema.XMLSchema(JUNIT_XSD).validate(str(bad))


# -- progress, Ctrl-C and the retry hint -----------------------------------------------------
def test_failures_print_the_retry_failed_command(world: World) -> None:
    output = world.broken_output  # type: ignore[attr-defined]

    assert f"Next: osmosis eval run {CONFIG} --name broken --retry-failed" in output


def test_progress_prints_lines_without_a_terminal(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    rows = [row("pass", a, 3, sleep=0.25) for a in range(2, 12)]
    config = make_workspace(tmp_path, rows, limit=10, batch_size=1)

    done = osmosis(
        "eval",
        "run",
        str(config),
        "--name",
        "slow",
        "-y",
        cwd=tmp_path,
        env=model_env(fake_model),
    )

    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("eval ")]
    # One line per tenth of the work (at most one a second) and the last one at the end.
    assert 2 <= len(lines) <= 10, done.stdout
    assert lines[-1].startswith("eval 10/10 (100%) · pass 100% · 10 passed · 0 not passed")


def test_ctrl_c_prints_the_resume_command(tmp_path: Path, fake_model: FakeModelServer) -> None:
    rows = [row("pass", a, 7, sleep=0.3) for a in range(2, 22)]
    make_workspace(tmp_path, rows, limit=20, batch_size=2)
    process = subprocess.Popen(
        [*CLI, "eval", "run", CONFIG, "--name", "stopped", "-y"],
        cwd=tmp_path,
        env=model_env(fake_model),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    journal = tmp_path / ".osmosis" / "evals" / "stopped" / "events.jsonl"
    deadline = time.monotonic() + 60
    while not (journal.exists() and journal.read_bytes().count(b"\n") >= 2):
        assert time.monotonic() < deadline and process.poll() is None, "run never got going"
        time.sleep(0.05)

    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)

    assert process.returncode == 130
    assert "interrupted: the attempts that finished are recorded" in flat(stderr)
    assert f"resume with: osmosis eval run {CONFIG} --name stopped" in flat(stderr)


# -- eval submit --wait ------------------------------------------------------------------------
def test_submit_wait_follows_the_platform_run_and_gates_it(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    from tests.platform.eval_world import Server, make_repo, upload_dataset

    server = Server.start(tmp_path / "platform", fake_model)
    try:
        repo = make_repo(tmp_path / "ws", ROWS, limit=6)
        upload_dataset(server, repo)
        env = {**server.env, "BREAK_GRADER": ""}

        below = osmosis(
            "eval",
            "submit",
            CONFIG,
            "-y",
            "--wait",
            "--min-pass-rate",
            "0.9",
            cwd=repo.tree,
            env=env,
        )
        above = osmosis(
            "--json",
            "eval",
            "submit",
            CONFIG,
            "-y",
            "--wait",
            "--min-pass-rate",
            "0.5",
            cwd=repo.tree,
            env=env,
        )
        no_wait = osmosis(
            "eval", "submit", CONFIG, "-y", "--min-pass-rate", "0.5", cwd=repo.tree, env=env
        )
        # Every row's grader raises: the run finishes with every attempt errored.
        crashing = make_repo(
            tmp_path / "ws2", [row("grader_error", a, 7) for a in range(2, 6)], limit=4
        )
        upload_dataset(server, crashing)  # the same dataset name, overwritten
        crashed = osmosis("eval", "submit", CONFIG, "-y", "--wait", cwd=crashing.tree, env=env)
    finally:
        server.stop()

    assert below.returncode == GATE_EXIT, below.stderr
    assert "finished · 6/6 samples" in flat(below.stdout + below.stderr)
    assert "gate failed: pass rate 83.3% < 90.0% (--min-pass-rate)" in flat(below.stderr)
    assert above.returncode == 0, above.stderr
    envelope = json.loads(above.stdout)  # one document, at the end
    assert envelope["resource"]["status"] == "finished"
    assert envelope["resource"]["gates"] == [
        {"flag": "--min-pass-rate", "threshold": 0.5, "value": 5 / 6, "passed": True}
    ]
    assert no_wait.returncode == 1
    assert "need --wait" in flat(no_wait.stderr)
    assert envelope["resource"]["outcomes"] == BASE_OUTCOMES  # as `eval run` counts them
    assert crashed.returncode == ERRORED_EXIT, crashed.stdout + crashed.stderr
    assert "every attempt errored (4): exit 5" in flat(crashed.stderr)


def test_submit_wait_outlasts_a_platform_restart(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    # A CI job following a long run must not fail because one poll found the platform
    # restarting: the run goes on there, and the job should report how it ended.
    from tests.platform.eval_world import Server, make_repo, upload_dataset

    server = Server.start(tmp_path / "platform", fake_model)
    try:
        rows = [row("pass", a, 3, sleep=0.5) for a in range(2, 14)]
        repo = make_repo(tmp_path / "ws", rows, limit=12, batch_size=1)
        upload_dataset(server, repo)
        waiting = subprocess.Popen(
            [*CLI, "eval", "submit", CONFIG, "-y", "--wait", "--min-pass-rate", "0.9"],
            cwd=repo.tree,
            env=server.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 90
        with server.client() as client:
            while not any(r.status == "running" for r in client.runs.list(git=repo.git).eval_runs):
                assert time.monotonic() < deadline and waiting.poll() is None, "never started"
                time.sleep(0.2)
        server.stop()
        time.sleep(3)  # a poll or two finds nobody listening
        server.launch()
        stdout, stderr = waiting.communicate(timeout=180)
    finally:
        server.stop()

    said = flat(stdout + stderr)
    assert waiting.returncode == 0, said
    assert "no answer from the platform" in said and "the platform answers again" in said
    assert "finished · 12/12 samples" in said
    assert "gate passed: pass rate 100.0% >= 90.0% (--min-pass-rate)" in said


def test_compare_refuses_platform_runs_that_sampled_different_rows(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    # Without `limit` the platform runs a random 10 % of the rows: two such runs both have
    # rows 0..3, of different dataset rows, and pairing them by index compares nothing.
    from tests.platform.eval_world import Server, make_repo, upload_dataset

    server = Server.start(tmp_path / "platform", fake_model)
    try:
        repo = make_repo(tmp_path / "ws", [row("pass", a, 3) for a in range(40)])
        upload_dataset(server, repo)
        names = []
        for _ in range(2):
            done = osmosis(
                "--json", "eval", "submit", CONFIG, "-y", "--wait", cwd=repo.tree, env=server.env
            )
            assert done.returncode == 0, done.stderr
            names.append(json.loads(done.stdout)["resource"]["name"])
        refused = osmosis("eval", "compare", *names, cwd=repo.tree, env=server.env)
        itself = osmosis("eval", "compare", names[0], names[0], cwd=repo.tree, env=server.env)
    finally:
        server.stop()

    said = flat(refused.stderr)
    assert refused.returncode == 1, refused.stdout
    # The attempts say which dataset row each row was: the refusal names the pairs.
    assert "rows are other dataset rows:" in said and "ran different source rows (row " in said
    assert "the platform samples 10 % at random): set limit" in said
    assert itself.returncode == 0, itself.stderr


# -- three outcomes (issue 27) ---------------------------------------------------------------
BROKEN_OUTCOMES = {"passed": 3, "not_passed": 1, "errored": 2, "skipped": 0}
BASE_OUTCOMES = {"passed": 5, "not_passed": 1, "errored": 0, "skipped": 0}


def test_every_surface_counts_the_three_outcomes_alike(world: World, tmp_path: Path) -> None:
    # `broken`: rows 0, 2 and 5 right, row 3 wrong, rows 1 and 4 crash in the grader.
    output = flat(world.broken_output)  # type: ignore[attr-defined]
    junit = tmp_path / "junit.xml"
    run = world.eval_run("broken", "--json", "--junit", str(junit))
    run_dir = str(world.workspace / ".osmosis" / "evals" / "broken")
    info = json.loads(world.run("eval", "info", run_dir, "--json").stdout)
    shown = flat(world.run("eval", "info", run_dir).stdout)

    assert "3 passed · 1 not passed · 2 errored · 0 skipped" in output  # progress line
    assert "complete · 3 passed · 1 not passed · 2 errored · 0 skipped" in output  # summary
    assert "error_type=agent_error: " in output and "broken on purpose" in output
    assert run.returncode == 0, run.stderr
    resource = json.loads(run.stdout)["resource"]
    assert resource["outcomes"] == BROKEN_OUTCOMES
    assert (resource["failed"], resource["succeeded"]) == (2, 4)  # today's fields stay
    assert resource["metrics"]["outcomes"] == BROKEN_OUTCOMES
    assert all(row["error_message"] for row in resource["failed_rows"])
    assert info["data"]["results"]["outcomes"] == BROKEN_OUTCOMES
    assert "3 passed, 1 not passed, 2 errored, 0 skipped" in shown
    properties = {
        p.get("name"): p.get("value") for p in ElementTree.parse(junit).getroot().iter("property")
    }
    assert {k: int(properties[f"outcomes.{k}"]) for k in BROKEN_OUTCOMES} == BROKEN_OUTCOMES


def test_wrong_answers_exit_0_and_an_all_errored_run_has_its_own_code(
    world: World, tmp_path: Path, fake_model: FakeModelServer
) -> None:
    base = world.eval_run("base", "--json")
    config = make_workspace(tmp_path, [row("breakable", a, 7) for a in (2, 3, 4, 5)], limit=4)
    crashed = osmosis(
        "eval", "run", str(config), "--name", "crashed", "-y",
        cwd=tmp_path, env={**model_env(fake_model), "BREAK_GRADER": "1"},
    )  # fmt: skip

    assert base.returncode == 0, base.stderr
    assert json.loads(base.stdout)["resource"]["outcomes"] == BASE_OUTCOMES
    assert crashed.returncode == ERRORED_EXIT, crashed.stdout + crashed.stderr
    assert "every attempt errored (4): exit 5" in flat(crashed.stderr)
    assert "finished" in crashed.stdout
