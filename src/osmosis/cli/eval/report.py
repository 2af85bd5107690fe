"""What a CI job reads after a run: gates (`--min-pass-rate`, `--min-mean-reward`), a Markdown
summary (`--report FILE.md`, for a job summary or a PR comment) and a JUnit file
(`--junit FILE.xml`, a test case per dataset row).

    gates = check_gates(summary, min_pass_rate=0.8, min_mean_reward=None)
    Path("report.md").write_text(markdown_report(facts, gates))
    Path("junit.xml").write_text(junit_xml(facts))

A gate compares the point estimate (what the results table shows) with the threshold; the
interval beside it says how sure that is. A JUnit row passes when every scored attempt of it
passed; it is an `error` when an attempt errored, a `failure` when an attempt was not passed
(graded below the threshold or not at all), `skipped` when every attempt was skipped. The
suite's properties count the attempts' four outcomes (`osmosis.vocabulary.outcome`).
"""

from __future__ import annotations

import math
import re
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from osmosis.vocabulary import (
    DEFAULT_PASS_THRESHOLD,
    OUTCOMES,
    count_outcomes,
    describe_outcomes,
    format_rate,
    outcome,
    passes,
)

if TYPE_CHECKING:
    from osmosis.eval.results.records import AttemptRecord

GATE_EXIT_CODE: Final = 3
"""A finished run below `--min-pass-rate` or `--min-mean-reward` (1 stays "error/partial")."""
ERRORED_EXIT_CODE: Final = 5
"""A finished run in which every attempt errored (skipped ones aside): nothing was graded
because nothing worked, which no gate is needed to see. It wins over `GATE_EXIT_CODE`."""
_FAILED_SHOWN = 20
# Provider SDKs colour their exception texts, so error messages arrive with terminal escapes
# (CSI and OSC sequences); XML 1.0 cannot hold ESC, NUL or most other control characters at
# all, and one of them makes a CI reader reject the whole JUnit file.
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff\ufffe\uffff]")


def printable(value: object) -> str:
    """`value` as text without terminal colour codes or characters XML 1.0 cannot hold
    (tab, newline and carriage return stay).

    printable("\\x1b[31mfailed\\x1b[0m\\x00")  # 'failed'
    """
    return _NOT_XML.sub("", _ANSI.sub("", str(value)))


@dataclass(frozen=True)
class Gate:
    """One threshold a run must reach."""

    flag: str
    label: str
    threshold: float
    value: float | None
    """The run's value; None when it has none (no graded attempt for a reward gate)."""

    @property
    def passed(self) -> bool:
        return self.value is not None and self.value >= self.threshold

    def describe(self) -> str:
        shown = "none" if self.value is None else self._format(self.value)
        relation = ">=" if self.passed else "<"
        if self.value is None:
            return f"{self.label} {shown}: no graded attempt to compare with {self.flag}"
        return f"{self.label} {shown} {relation} {self._format(self.threshold)} ({self.flag})"

    def _format(self, value: float) -> str:
        return f"{value:.1%}" if self.flag == "--min-pass-rate" else f"{value:.3f}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "flag": self.flag,
            "threshold": self.threshold,
            "value": self.value,
            "passed": self.passed,
        }


def check_gates(
    summary: Mapping[str, Any],
    *,
    min_pass_rate: float | None,
    min_mean_reward: float | None,
) -> list[Gate]:
    """The gates asked for, each with the run's value.

    [g.passed for g in check_gates({"pass_rate": 0.5}, min_pass_rate=0.8, min_mean_reward=None)]
    # [False]
    """
    gates = []
    if min_pass_rate is not None:
        scored = summary.get("completed_samples", 0)
        value = summary.get("pass_rate") if scored else None
        gates.append(Gate("--min-pass-rate", "pass rate", min_pass_rate, value))
    if min_mean_reward is not None:
        stats = summary.get("reward_stats") or {}
        gates.append(Gate("--min-mean-reward", "mean reward", min_mean_reward, stats.get("mean")))
    return gates


def check_gate_options(min_pass_rate: float | None, min_mean_reward: float | None) -> list[str]:
    """Problems with the gate flags themselves (all of them), before anything runs."""
    problems = []
    if min_pass_rate is not None and not (
        math.isfinite(min_pass_rate) and 0.0 <= min_pass_rate <= 1.0
    ):
        problems.append(f"--min-pass-rate must be between 0 and 1 (e.g. 0.8), got {min_pass_rate}")
    if min_mean_reward is not None and not math.isfinite(min_mean_reward):
        problems.append(f"--min-mean-reward must be a finite number, got {min_mean_reward}")
    return problems


@dataclass(frozen=True)
class RowText:
    """What a reviewer reads beside a row's outcome: its input, the expected answer (the
    dataset's label) and each attempt's final output, by run index. None: not recorded."""

    input: str | None = None
    expected: str | None = None
    outputs: Mapping[int, str | None] = field(default_factory=dict)


def row_texts(run_dir: Path, pass_threshold: float) -> dict[int, RowText]:
    """Each row's texts from a local run directory, as the viewer reads them."""
    from osmosis.platform import local_row_texts

    return {
        row: RowText(input=given, expected=expected, outputs=outputs)
        for row, (given, expected, outputs) in local_row_texts(run_dir, pass_threshold).items()
    }


@dataclass(frozen=True)
class RunFacts:
    """What the report and the JUnit file say about one run."""

    name: str
    status: str
    """`finished` or `incomplete`."""
    summary: Mapping[str, Any]
    records: Sequence[AttemptRecord]
    output_path: Path
    duration_ms: float
    total_work_items: int
    local_run_id: str = ""
    next_steps: Sequence[str] = field(default_factory=list)
    """Commands worth running next (resume, --retry-failed)."""
    rows: Mapping[int, RowText] = field(default_factory=dict)
    """Each row's input, expected answer and outputs (`row_texts`); empty: not read."""


# -- Markdown ---------------------------------------------------------------------------------
def _cell(value: object) -> str:
    # A pipe ends a table cell and a newline ends the row: neither may come from a message;
    # and a message's `<tag>` is shown, not rendered, in a job summary or PR comment.
    text = printable(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def _code(value: object) -> str:
    # Inside backticks nothing is rendered; only a backtick or a line break could end it.
    return printable(value).replace("`", "'").replace("\r", " ").replace("\n", " ")


def _interval(summary: Mapping[str, Any], key: str, fmt: str) -> str:
    ci = (summary.get("confidence_intervals") or {}).get(key)
    if not ci:
        return ""
    return f" — {ci['level']:.0%} CI {ci['low']:{fmt}} to {ci['high']:{fmt}} ({ci['method']})"


def markdown_report(facts: RunFacts, gates: Sequence[Gate] = ()) -> str:
    """A Markdown summary of the run: results with intervals, gates, errors, failed rows."""
    m = facts.summary
    failed_gates = [gate for gate in gates if not gate.passed]
    if facts.status != "finished":
        verdict = "incomplete"
    elif failed_gates:
        verdict = "below a gate"
    elif all_errored({"outcomes": _outcomes(facts)}):
        verdict = "finished, every attempt errored"  # not a green "finished" (issue 16.4)
    else:
        verdict = "finished"
    lines = [f"## osmosis eval run `{_code(facts.name)}`: {verdict}", ""]
    scored = m.get("completed_samples", 0)
    rows = [
        (
            "Work items",
            f"{m.get('total_samples', 0)}/{facts.total_work_items} complete: "
            + describe_outcomes(_outcomes(facts)),
        ),
        (
            "Pass rate",
            f"{m.get('pass_rate', 0.0):.1%} ({m.get('passed', 0)}/{scored} scored, threshold "
            f"{m.get('pass_threshold', DEFAULT_PASS_THRESHOLD):g})"
            + _interval(m, "pass_rate", ".1%"),
        ),
    ]
    stats = m.get("reward_stats")
    if stats:
        rows.append(
            (
                "Mean reward",
                f"{stats['mean']:.3f} (median {stats['median']:.3f}, min {stats['min']:.3f}, "
                f"max {stats['max']:.3f})" + _interval(m, "mean_reward", ".3f"),
            )
        )
    if m.get("pass_at_k"):
        rows.append(
            ("pass@k", ", ".join(f"@{p['k']} {format_rate(p['value'])}" for p in m["pass_at_k"]))
        )
    if m.get("pass_hat_k"):
        rows.append(
            ("pass^k", ", ".join(f"^{p['k']} {format_rate(p['value'])}" for p in m["pass_hat_k"]))
        )
    rows.append(("Tokens", f"{m.get('tokens_used', 0):,}"))
    if m.get("cost_usd") is not None:
        rows.append(("Cost", f"${m['cost_usd']:.4f}"))
    rows.append(("Duration", f"{facts.duration_ms / 1000:.1f}s"))
    rows.append(("Output", f"`{_code(facts.output_path)}`"))
    lines += ["| Metric | Value |", "|---|---|"]
    lines += [f"| {label} | {_cell(value)} |" for label, value in rows]
    if gates:
        lines += ["", "### Gates", ""]
        lines += [f"- {'✅' if g.passed else '❌'} {g.describe()}" for g in gates]  # our own words
    errors = m.get("errors_by_type") or {}
    if errors:
        lines += ["", "### Errors by type", "", "| Error type | Attempts |", "|---|---|"]
        lines += [f"| {_cell(kind)} | {count} |" for kind, count in errors.items()]
    threshold = float(m.get("pass_threshold", DEFAULT_PASS_THRESHOLD))
    not_passed = [
        r for r in facts.records if outcome(r.status, r.reward, threshold) == "not_passed"
    ]
    if not_passed:
        lines += ["", f"### Not passed attempts ({len(not_passed)})", ""]
        lines += [
            "| Row | Attempt | Reward | Output | Input | Expected |",
            "|---|---|---|---|---|---|",
        ]
        for record in not_passed[:_FAILED_SHOWN]:
            text = facts.rows.get(record.row_index) or RowText()
            reward = "not graded" if record.reward is None else f"{record.reward:g}"
            if record.reward_explanation:
                reward += f" ({_short(record.reward_explanation, 80)})"
            lines.append(
                f"| {record.row_index} | {record.run_index} | {reward} | "
                f"{_cell(_short(text.outputs.get(record.run_index), 120))} | "
                f"{_cell(_short(text.input, 120))} | {_cell(_short(text.expected, 60))} |"
            )
        if len(not_passed) > _FAILED_SHOWN:
            lines.append(f"\n… and {len(not_passed) - _FAILED_SHOWN} more (see `index.jsonl`).")
    failed = [r for r in facts.records if r.status == "failed"]
    if failed:
        lines += ["", f"### Errored attempts ({len(failed)})", ""]
        lines += [
            "| Row | Attempt | Error | Message | Input | Expected |",
            "|---|---|---|---|---|---|",
        ]
        for record in failed[:_FAILED_SHOWN]:
            text = facts.rows.get(record.row_index) or RowText()
            message = (record.error_message or "")[:200]
            lines.append(
                f"| {record.row_index} | {record.run_index} | {_cell(record.error_type)} | "
                f"{_cell(message)} | {_cell(_short(text.input, 120))} | "
                f"{_cell(_short(text.expected, 60))} |"
            )
        if len(failed) > _FAILED_SHOWN:
            lines.append(f"\n… and {len(failed) - _FAILED_SHOWN} more (see `index.jsonl`).")
    if facts.next_steps:
        lines += ["", "### Next", ""]
        lines += [f"- `{_code(step)}`" for step in facts.next_steps]
    return "\n".join(lines) + "\n"


def _outcomes(facts: RunFacts) -> dict[str, int]:
    """The four outcome counts: the summary's, else counted from the records (an older
    `metrics.json`), so the report, the JUnit file and `eval run` agree."""
    counts = facts.summary.get("outcomes")
    if counts:
        return {name: int(counts.get(name, 0)) for name in OUTCOMES}
    threshold = float(facts.summary.get("pass_threshold", DEFAULT_PASS_THRESHOLD))
    counted = count_outcomes(((r.status, r.reward) for r in facts.records), threshold)
    return {name: count for name, count in counted.items()}


# -- JUnit ------------------------------------------------------------------------------------
def _by_row(records: Iterable[AttemptRecord]) -> dict[int, list[AttemptRecord]]:
    rows: dict[int, list[AttemptRecord]] = {}
    for record in records:
        rows.setdefault(record.row_index, []).append(record)
    return dict(sorted(rows.items()))


def _attempt_line(record: AttemptRecord, threshold: float) -> str:
    if record.status == "failed":
        message = printable(f"{record.error_type}: {record.error_message or ''}")
        return f"attempt {record.run_index}: {message}"
    if record.status == "skipped":
        return f"attempt {record.run_index}: skipped"
    if record.reward is None:
        return f"attempt {record.run_index}: not graded (not passed)"
    verdict = "passed" if passes(record.reward, threshold) else "not passed"
    why = f": {printable(record.reward_explanation)}" if record.reward_explanation else ""
    return f"attempt {record.run_index}: reward {record.reward:g} ({verdict}){why}"


def _short(text: str | None, limit: int) -> str:
    flat = " ".join(printable(text or "").split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _case_name(row_index: int, text: RowText | None) -> str:
    """`row 3: What is 2 * 7? … → 14`: a CI page lists what was asked and expected."""
    name = f"row {row_index}"
    if text is not None and text.input:
        name += f": {_short(text.input, 60)}"
    if text is not None and text.expected:
        name += f" → {_short(text.expected, 30)}"
    return name


def junit_xml(facts: RunFacts) -> str:
    """The run as JUnit XML: one `<testsuite>` for the run, one `<testcase>` per row."""
    from xml.etree import ElementTree  # only for --junit: every `eval run` imports this module

    threshold = float(facts.summary.get("pass_threshold", DEFAULT_PASS_THRESHOLD))
    rows = _by_row(facts.records)
    counts = {"failures": 0, "errors": 0, "skipped": 0}
    cases = []
    for row_index, attempts in rows.items():
        case = ElementTree.Element(
            "testcase",
            name=_case_name(row_index, facts.rows.get(row_index)),
            classname=f"osmosis.eval.{printable(facts.name)}",
            time=f"{sum(r.duration_ms for r in attempts) / 1000:.3f}",
        )
        scored = [r for r in attempts if r.status != "skipped"]
        passed = [r for r in scored if passes(r.reward, threshold)]
        tally = f"{len(passed)}/{len(scored)} scored attempts passed (threshold {threshold:g})"
        detail = "\n".join(_attempt_line(r, threshold) for r in attempts)
        errored = [r for r in scored if r.status == "failed"]
        if not scored:
            counts["skipped"] += 1
            ElementTree.SubElement(case, "skipped", message="every attempt was skipped")
        elif errored:
            counts["errors"] += 1
            element = ElementTree.SubElement(
                case, "error", type=printable(errored[0].error_type or "error"), message=tally
            )
            element.text = detail
        elif len(passed) < len(scored):
            counts["failures"] += 1
            element = ElementTree.SubElement(case, "failure", type="not_passed", message=tally)
            element.text = detail
        out = ElementTree.SubElement(case, "system-out")
        out.text = detail
        cases.append(case)
    seconds = f"{facts.duration_ms / 1000:.3f}"
    suite = ElementTree.Element(
        "testsuite",
        name=printable(facts.name),
        tests=str(len(rows)),
        failures=str(counts["failures"]),
        errors=str(counts["errors"]),
        skipped=str(counts["skipped"]),
        time=seconds,
        timestamp=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S"),
        hostname=socket.gethostname(),
    )
    properties = ElementTree.SubElement(suite, "properties")
    summary = facts.summary
    for name, value in (
        ("status", facts.status),
        ("local_run_id", facts.local_run_id),
        ("pass_rate", summary.get("pass_rate")),
        ("pass_threshold", threshold),
        ("mean_reward", (summary.get("reward_stats") or {}).get("mean")),
        ("output_path", str(facts.output_path)),
        *((f"outcomes.{name}", count) for name, count in _outcomes(facts).items()),
    ):
        if value is not None and value != "":
            ElementTree.SubElement(properties, "property", name=name, value=printable(value))
    suite.extend(cases)
    root = ElementTree.Element(
        "testsuites",
        name="osmosis eval",
        tests=str(len(rows)),
        failures=str(counts["failures"]),
        errors=str(counts["errors"]),
        time=seconds,
    )
    root.append(suite)
    ElementTree.indent(root)
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        + ElementTree.tostring(root, encoding="unicode")
        + "\n"
    )


def write_outputs(
    facts: RunFacts, gates: Sequence[Gate], *, report: Path | None, junit: Path | None
) -> list[str]:
    """Write the asked-for files; returns the paths written (for the envelope)."""
    written = []
    if report is not None:
        _write(report, markdown_report(facts, gates))
        written.append(str(report))
    if junit is not None:
        _write(junit, junit_xml(facts))
        written.append(str(junit))
    return written


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text, encoding="utf-8")
    partial.replace(path)


# -- after `eval run` -------------------------------------------------------------------------
def rerun_command(
    config: Path, name: str, output_root: Path | None, dataset_file: Path | None
) -> str:
    """The `eval run` line that resumes this run (same name, same output root and dataset)."""
    import shlex

    parts = ["osmosis", "eval", "run", str(config), "--name", name]
    if output_root is not None:
        parts += ["-o", str(output_root)]
    if dataset_file is not None:
        parts += ["--dataset-file", str(dataset_file)]
    return shlex.join(parts)


@dataclass
class Outcome:
    """What `eval run` adds to its envelope, and how it exits."""

    status: str
    gates: list[Gate]
    resource: dict[str, Any]
    next_steps: list[str]
    error: Exception | None = None
    errored: int = 0
    """Attempts that errored, when every attempt that was not skipped did; else 0."""

    def finish(self, out: Any) -> None:
        """Exit as documented: 1 for an error or an incomplete run, 5 when every attempt
        errored, 3 below a gate, else 0."""
        import typer

        if self.error is not None:
            raise self.error
        if self.status != "finished":
            raise typer.Exit(1)
        failed = [gate for gate in self.gates if not gate.passed]
        if out.mode.value != "json":
            for gate in self.gates:
                if gate.passed:
                    out.info(f"gate passed: {gate.describe()}")
            for gate in failed:
                out.err_console.print(
                    f"gate failed: {gate.describe()}", markup=False, highlight=False
                )
        if self.errored:
            out.err_console.print(
                f"every attempt errored ({self.errored}): exit {ERRORED_EXIT_CODE}",
                markup=False,
                highlight=False,
            )
            raise typer.Exit(ERRORED_EXIT_CODE)
        if failed:
            raise typer.Exit(GATE_EXIT_CODE)


def conclude(
    out: Any,
    report: Any,
    *,
    rerun: str,
    min_pass_rate: float | None,
    min_mean_reward: float | None,
    report_file: Path | None,
    junit_file: Path | None,
    upload: bool,
) -> Outcome:
    """Gates, --report/--junit files and --upload for a `RunReport`."""
    from osmosis.cli.output import CLIError

    gates = check_gates(
        report.metrics, min_pass_rate=min_pass_rate, min_mean_reward=min_mean_reward
    )
    next_steps = []
    if report.status != "finished":
        next_steps.append(rerun)
    if report.failed_rows:
        next_steps.append(f"{rerun} --retry-failed")
    resource: dict[str, Any] = {}
    if gates:
        resource["gates"] = [gate.as_dict() for gate in gates]
        resource["gates_passed"] = all(gate.passed for gate in gates)
    if report_file is not None or junit_file is not None:
        from osmosis.cli.eval.local_runs import read_local_run

        facts = RunFacts(
            name=report.run_name,
            status=report.status,
            summary=report.metrics,
            records=read_local_run(report.output_path).records(),
            output_path=report.output_path,
            duration_ms=report.duration_ms,
            total_work_items=report.total_work_items,
            local_run_id=report.local_run_id,
            next_steps=next_steps,
            rows=row_texts(
                report.output_path,
                float(report.metrics.get("pass_threshold", DEFAULT_PASS_THRESHOLD)),
            ),
        )
        resource["files"] = write_outputs(facts, gates, report=report_file, junit=junit_file)
    error: Exception | None = None
    if upload:
        if report.status != "finished":
            error = CLIError(
                "--upload: the run is incomplete, so nothing was uploaded",
                code="VALIDATION",
                details={"run_name": report.run_name, "status": report.status},
                hint=f"finish it first: {rerun}",
            )
        else:
            from osmosis.cli.eval.upload import upload_run

            try:
                resource["upload"] = upload_run(out, report.output_path, replace=False)
            except CLIError as failure:
                error = failure
    return Outcome(
        status=report.status,
        gates=gates,
        resource=resource,
        next_steps=next_steps,
        error=error,
        errored=all_errored(report.metrics),
    )


def all_errored(summary: Mapping[str, Any]) -> int:
    """How many attempts errored when every attempt not skipped did (the run exits
    `ERRORED_EXIT_CODE`), else 0.

        all_errored({"outcomes": {"passed": 0, "not_passed": 0, "errored": 3}})  # 3
    """
    counts = summary.get("outcomes") or {}
    errored = int(counts.get("errored", 0))
    graded = int(counts.get("passed", 0)) + int(counts.get("not_passed", 0))
    return errored if errored and not graded else 0
