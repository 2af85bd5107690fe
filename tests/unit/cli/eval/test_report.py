"""CI outputs from recorded attempts: gates, the Markdown summary and the JUnit file."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from xml.etree import ElementTree

import pytest
import xmlschema

from osmosis.cli.eval.report import (
    RunFacts,
    check_gate_options,
    check_gates,
    junit_xml,
    markdown_report,
    rerun_command,
)
from osmosis.eval.results.metrics import summarize
from osmosis.eval.results.records import AttemptRecord

JUNIT_XSD = Path(__file__).parents[3] / "e2e" / "schemas" / "junit.xsd"


def attempt(row: int, run: int, outcome: float | str) -> AttemptRecord:
    fields: dict[str, object] = {"status": "success", "reward": outcome}
    if outcome == "fail":
        fields = {"status": "failed", "error_type": "timeout", "error_message": "a | b\nc"}
    elif outcome == "skip":
        fields = {"status": "skipped"}
    return AttemptRecord(
        row_index=row,
        run_index=run,
        rollout_id=f"{row * 10 + run:032x}",
        source_row_index=row,
        duration_ms=1500.0,
        finished_at=datetime(2026, 1, 1, tzinfo=UTC),
        **fields,  # type: ignore[arg-type]
    )


def facts(records: list[AttemptRecord], name: str = "ci-run") -> RunFacts:
    return RunFacts(
        name=name,
        status="finished",
        summary=summarize(records),
        records=records,
        output_path=Path("/tmp/ci-run"),
        duration_ms=3000.0,
        total_work_items=len(records),
        next_steps=["osmosis eval run c.toml --name ci-run --retry-failed"],
    )


RECORDS = [
    attempt(0, 0, 1.0),
    attempt(0, 1, 1.0),
    attempt(1, 0, 1.0),
    attempt(1, 1, "fail"),
    attempt(2, 0, 0.0),
    attempt(2, 1, 1.0),
    attempt(3, 0, "skip"),
    attempt(3, 1, "skip"),
]


def test_junit_has_one_case_per_row_with_its_outcome_and_validates() -> None:
    text = junit_xml(facts(RECORDS))

    xmlschema.XMLSchema(JUNIT_XSD).validate(text)
    suite = ElementTree.fromstring(text).find("testsuite")
    assert suite is not None
    counts = {k: suite.get(k) for k in ("tests", "failures", "errors", "skipped")}
    assert counts == {"tests": "4", "failures": "1", "errors": "1", "skipped": "1"}
    cases = list(suite.iter("testcase"))
    assert [c[0].tag for c in cases] == ["system-out", "error", "failure", "skipped"]
    assert cases[1][0].get("message") == "1/2 scored attempts passed (threshold 1)"
    assert cases[0].get("time") == "3.000"
    properties = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert properties["pass_rate"] == str(4 / 6)


def test_the_markdown_summary_keeps_its_tables_whole() -> None:
    text = markdown_report(
        facts(RECORDS), check_gates(summarize(RECORDS), min_pass_rate=0.9, min_mean_reward=None)
    )

    assert "| 1 | 1 | timeout | a \\| b c |" in text  # a pipe or newline cannot break the row
    assert "- ❌ pass rate 66.7% < 90.0% (--min-pass-rate)" in text
    assert "wilson_cluster" in text
    assert text.endswith("- `osmosis eval run c.toml --name ci-run --retry-failed`\n")
    assert "below a gate" in text.splitlines()[0]


def test_gates_without_values_fail_and_say_why() -> None:
    skipped = summarize([attempt(0, 0, "skip")])

    pass_gate, reward_gate = check_gates(skipped, min_pass_rate=0.0, min_mean_reward=0.0)

    assert not pass_gate.passed and not reward_gate.passed
    assert reward_gate.describe() == (
        "mean reward none: no graded attempt to compare with --min-mean-reward"
    )
    assert check_gates(skipped, min_pass_rate=None, min_mean_reward=None) == []


@pytest.mark.parametrize(
    ("rate", "reward", "problems"),
    [(0.8, 0.5, 0), (1.5, None, 1), (-0.1, float("inf"), 2), (None, float("nan"), 1)],
)
def test_gate_options_are_checked(rate: float | None, reward: float | None, problems: int) -> None:
    assert len(check_gate_options(rate, reward)) == problems


def test_the_resume_command_quotes_what_a_shell_would_split() -> None:
    command = rerun_command(Path("configs/eval/my run.toml"), "try 1", Path("out dir"), None)

    assert command == "osmosis eval run 'configs/eval/my run.toml' --name 'try 1' -o 'out dir'"


def test_terminal_colours_and_control_characters_never_break_the_files() -> None:
    # Provider SDKs colour their exception texts: str(exc) arrives with ANSI escapes, and an
    # XML 1.0 document cannot hold ESC or NUL at all (a CI reader rejects the whole file).
    message = "\x1b[31mrate limited\x1b[0m by <b>provider</b>\x00 | retry\x07 later"
    records = [
        attempt(0, 0, 1.0),
        attempt(1, 0, 1.0).model_copy(
            update={
                "status": "failed",
                "reward": None,
                "error_type": "agent_error",
                "error_message": message,
            }
        ),
    ]

    text = junit_xml(facts(records, name="ci\x1brun"))
    markdown = markdown_report(facts(records))

    xmlschema.XMLSchema(JUNIT_XSD).validate(text)  # parses, and conforms
    error = ElementTree.fromstring(text).find("testsuite/testcase[@name='row 1']/error")
    assert error is not None
    assert "attempt 0: agent_error: rate limited by <b>provider</b> | retry later" in (
        error.text or ""
    )
    assert (
        "| 1 | 0 | agent_error | rate limited by &lt;b&gt;provider&lt;/b&gt; \\| retry later |"
        in (markdown)
    )
    assert not any(ord(c) < 32 and c != "\n" for c in markdown)


def test_a_run_whose_every_attempt_failed_is_not_reported_as_plainly_finished() -> None:
    failed = [attempt(0, 0, "fail"), attempt(1, 0, "fail"), attempt(2, 0, "skip")]
    mixed = [attempt(0, 0, "fail"), attempt(1, 0, 1.0)]

    assert markdown_report(facts(failed)).splitlines()[0] == (
        "## osmosis eval run `ci-run`: finished, every attempt errored"
    )
    assert markdown_report(facts(mixed)).splitlines()[0] == "## osmosis eval run `ci-run`: finished"


def test_junit_and_the_report_count_the_four_outcomes() -> None:
    text = junit_xml(facts(RECORDS))
    report = markdown_report(facts(RECORDS))

    properties = {
        p.get("name"): p.get("value") for p in ElementTree.fromstring(text).iter("property")
    }
    outcomes = {
        k: properties[f"outcomes.{k}"] for k in ("passed", "not_passed", "errored", "skipped")
    }
    assert outcomes == {"passed": "4", "not_passed": "1", "errored": "1", "skipped": "2"}
    failure = ElementTree.fromstring(text).find(".//failure")
    assert failure is not None and failure.get("type") == "not_passed"
    assert "attempt 0: reward 0 (not passed)" in (failure.text or "")
    assert "complete: 4 passed, 1 not passed, 1 errored, 2 skipped" in report
    assert "### Errored attempts (1)" in report


@pytest.mark.parametrize(
    ("records", "errored"),
    [
        ([attempt(0, 0, "fail"), attempt(1, 0, "fail"), attempt(2, 0, "skip")], 2),
        ([attempt(0, 0, "fail"), attempt(1, 0, 0.0)], 0),  # a wrong answer is not an error
        ([attempt(0, 0, 0.0)], 0),
        ([attempt(0, 0, "skip")], 0),
    ],
)
def test_only_a_run_whose_every_attempt_errored_exits_with_its_own_code(
    records: list[AttemptRecord], errored: int
) -> None:
    import typer
    from rich.console import Console

    from osmosis.cli.eval.report import ERRORED_EXIT_CODE, Outcome, all_errored
    from osmosis.cli.output import Mode, Output

    assert all_errored(summarize(records)) == errored
    out = Output(mode=Mode.PLAIN, _console=Console(record=True))
    outcome = Outcome(status="finished", gates=[], resource={}, next_steps=[], errored=errored)
    if errored:
        with pytest.raises(typer.Exit) as exit_:
            outcome.finish(out)
        assert exit_.value.exit_code == ERRORED_EXIT_CODE == 5
    else:
        outcome.finish(out)  # wrong answers alone: exit 0


def test_rates_and_their_intervals_read_in_one_unit_everywhere() -> None:
    # pass rate, pass@k, pass^k and the pass rate's interval are percents on every surface;
    # rewards stay plain numbers.
    from osmosis.cli.eval.run import results_table
    from osmosis.eval.host.run import RunReport

    summary = summarize(RECORDS)
    report = RunReport(
        run_name="ci-run",
        local_run_id="x",
        output_path=Path("/tmp/ci-run"),
        status="finished",
        total_work_items=len(RECORDS),
        metrics=summary,
    )
    table = results_table(report)
    ci = summary["confidence_intervals"]["pass_rate"]
    assert f"CI {ci['low']:.1%} to {ci['high']:.1%}" in table["Pass Rate"]
    assert table["pass@k"] == ", ".join(f"@{p['k']} {p['value']:.1%}" for p in summary["pass_at_k"])
    assert table["pass^k"].startswith(f"^1 {summary['pass_hat_k'][0]['value']:.1%}")
    assert f"mean {summary['reward_stats']['mean']:.3f}" in table["Reward"]
    text = markdown_report(facts(RECORDS))
    assert f"| pass@k | @1 {summary['pass_at_k'][0]['value']:.1%}" in text
