"""`osmosis eval rubric`: judge a JSONL file of candidates with an LLM and a rubric, locally.

No workspace and no account: the judge is any model the engine can call (`openai/...` with
`OPENAI_API_BASE` for an OpenAI-compatible server, any LiteLLM id, or `local/smollm2-135m`).
Only typer is imported here at module level, so registering the command costs nothing at
start-up; the engine loads when the command runs.

    osmosis eval rubric -d answers.jsonl -r @rubric.txt --model openai/gpt-4o-mini -n 3 -o out/
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from osmosis.cli.output import Output
    from osmosis.rubric.cache import VerdictCache
    from osmosis.rubric.records import RecordSet, RubricRecord
    from osmosis.rubric.runner import Judgement, RubricReport, RubricSettings

__all__ = ["RESULT_FILE", "rubric_command"]

RESULT_FILE = "rubric_eval_result.json"
_SHOWN_PROBLEMS = 20


def rubric_command(
    data: Path = typer.Option(..., "--data", "-d", help="JSONL file of records to judge."),
    rubric: str = typer.Option(
        ..., "--rubric", "-r", help="The rubric text, or @file to read it from a file."
    ),
    model: str = typer.Option(
        ..., "--model", help="Judge model: a LiteLLM id (openai/gpt-4o-mini) or local/<name>."
    ),
    number: int = typer.Option(1, "--number", "-n", help="Judgements per record."),
    # A string, not a Path: a trailing slash ("out/") means "a directory" and Path drops it.
    output_path: str | None = typer.Option(
        None, "--output", "-o", help=f"Write the results as JSON (a directory gets {RESULT_FILE})."
    ),
    timeout: float | None = typer.Option(
        None,
        "--timeout",
        help="Seconds one judge call may take (default 30; a local/ model: 120, it answers one "
        "call at a time on this machine's CPU).",
    ),
    score_min: float = typer.Option(0.0, "--score-min", help="Lowest score the judge may give."),
    score_max: float = typer.Option(
        1.0, "--score-max", help="Highest score the judge may give (must exceed --score-min)."
    ),
    concurrency: int | None = typer.Option(
        None, "--concurrency", help="Judge calls in flight at once (default 8; a local/ model: 1)."
    ),
    max_tokens: int | None = typer.Option(
        None,
        "--max-tokens",
        help="Token limit of each verdict (default: the provider's; a local/ model: 96).",
    ),
    strict: bool = typer.Option(
        False, "--strict", help="Abort on any malformed line instead of skipping it."
    ),
    no_cache: bool = typer.Option(
        False, "--no-cache", help="Neither read nor store cached verdicts."
    ),
    cache_dir: Path | None = typer.Option(
        None,
        "--cache-dir",
        help="Where verdicts are cached (default $OSMOSIS_HOME/cache/rubric, else "
        "~/.osmosis/cache/rubric).",
    ),
) -> None:
    """Score each record's candidate with an LLM judge and a rubric (no workspace needed)."""
    import asyncio

    from osmosis.cli.output import CLIError, output
    from osmosis.eval.model.local_model import is_local_model
    from osmosis.rubric.judge import ScoreRange
    from osmosis.rubric.runner import RubricSettings

    out = output()
    # The bundled local model decodes one call at a time on the CPU: eight calls in flight
    # with 30 s each timed out in line, so its defaults wait in line instead.
    local = is_local_model(model)
    if concurrency is None:
        concurrency = 1 if local else 8
    if timeout is None:
        timeout = 120.0 if local else 30.0
    if max_tokens is None and local:
        max_tokens = 96
    problems = []
    if number < 1:
        problems.append(f"--number must be at least 1, got {number}")
    if concurrency < 1:
        problems.append(f"--concurrency must be at least 1, got {concurrency}")
    if timeout <= 0:
        problems.append(f"--timeout must be positive, got {timeout:g}")
    if max_tokens is not None and max_tokens < 1:
        problems.append(f"--max-tokens must be at least 1, got {max_tokens}")
    if score_max <= score_min:
        problems.append(f"--score-max ({score_max:g}) must exceed --score-min ({score_min:g})")
    if problems:
        raise CLIError("; ".join(problems))
    rubric_text = _rubric_text(rubric)
    records = _read(data, strict=strict, out=out)
    target_file = _result_file(output_path) if output_path is not None else None
    settings = RubricSettings(
        model=model,
        rubric=rubric_text,
        number=number,
        score_range=ScoreRange(score_min, score_max),
        concurrency=concurrency,
    )
    report = asyncio.run(
        _run(
            out,
            records.items,
            settings,
            call_timeout=timeout,
            max_tokens=max_tokens,
            cache_path=None if no_cache else _cache_path(cache_dir),
        )
    )
    _finish(out, report, data_path=str(data), target_file=target_file)


# -- inputs -----------------------------------------------------------------------------------
def _rubric_text(value: str) -> str:
    from osmosis.cli.output import CLIError

    text = value
    if value.startswith("@"):
        path = Path(value[1:])
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise CLIError(
                f"cannot read the rubric file {path}: {error}", details={"path": str(path)}
            ) from None
    if not text.strip():
        raise CLIError("the rubric is empty", hint="pass the rubric text, or @file")
    return text


def _read(data: Path, *, strict: bool, out: Output) -> RecordSet:
    from osmosis.cli.output import CLIError
    from osmosis.rubric.records import read_records

    try:
        records = read_records(data)
    except (OSError, UnicodeDecodeError) as error:
        raise CLIError(f"cannot read {data}: {error}", details={"path": str(data)}) from None
    problems = [{"line": p.line, "message": p.message} for p in records.problems]
    if problems and strict:
        first = records.problems[0]
        raise CLIError(
            f"{len(problems)} malformed line(s) in {data}; the first, line {first.line}: "
            f"{first.message}",
            details={"path": str(data), "problems": problems},
            hint="fix them, or drop --strict to skip them",
        )
    for problem in records.problems[:_SHOWN_PROBLEMS]:
        out.warn(f"{data}:{problem.line}: skipped: {problem.message}")
    if len(problems) > _SHOWN_PROBLEMS:
        out.warn(f"… and {len(problems) - _SHOWN_PROBLEMS} more malformed lines skipped")
    if not records.items:
        raise CLIError(
            f"{data} has no record to judge",
            details={"path": str(data), "problems": problems},
            hint='each line needs "messages" (with an assistant message) or "solution_str"',
        )
    return records


def _result_file(value: str) -> Path:
    # The reference: an existing directory, or a path written with a trailing slash, gets
    # the default file name inside it.
    path = Path(value)
    if path.is_dir() or value.endswith(("/", "\\")):
        return path / RESULT_FILE
    return path


def _cache_path(cache_dir: Path | None) -> Path:
    from osmosis.rubric.cache import CACHE_FILE, default_cache_dir

    return (cache_dir if cache_dir is not None else default_cache_dir()) / CACHE_FILE


# -- the run ----------------------------------------------------------------------------------
async def _run(
    out: Output,
    records: list[RubricRecord],
    settings: RubricSettings,
    *,
    call_timeout: float,
    max_tokens: int | None,
    cache_path: Path | None,
) -> RubricReport:
    import contextlib
    import os

    from osmosis.cli.output import CLIError
    from osmosis.eval.model.local_model import LocalModelError, LocalModelServer, is_local_model
    from osmosis.eval.model.providers import ModelResolutionError, ModelTarget, resolve_model
    from osmosis.eval.model.providers import open_transport as open_model
    from osmosis.rubric.runner import JudgeClient, evaluate

    async with contextlib.AsyncExitStack() as stack:
        try:
            if is_local_model(settings.model):
                out.info(f"→ starting local model {settings.model}")
                server = LocalModelServer.for_model(settings.model)
                await stack.enter_async_context(server)
                target = ModelTarget(
                    kind="openai-compatible",
                    model=server.model,
                    api_base=server.base_url,
                    api_key=server.api_key,
                    model_path=settings.model,
                    timeout=call_timeout,
                )
            else:
                target = resolve_model(settings.model, os.environ, timeout=call_timeout)
        except (LocalModelError, ModelResolutionError) as error:
            raise CLIError(str(error), hint="no record was judged") from None
        transport = open_model(target)
        stack.push_async_callback(transport.aclose)
        cache: VerdictCache | None = None
        if cache_path is not None:
            cache = stack.enter_context(_open_cache(cache_path))
        judge = JudgeClient(transport, target, max_tokens=max_tokens)
        progress = _Progress(out, total=len(records) * settings.number)
        stack.callback(progress.close)
        return await evaluate(records, settings, judge, cache=cache, on_judgement=progress.advance)
    raise AssertionError("unreachable")  # pragma: no cover - the stack re-raises


def _open_cache(path: Path) -> VerdictCache:
    import sqlite3

    from osmosis.cli.output import CLIError
    from osmosis.rubric.cache import VerdictCache

    try:
        return VerdictCache.open(path)
    except (OSError, sqlite3.Error) as error:
        raise CLIError(
            f"cannot open the verdict cache {path}: {error}",
            hint="pass --cache-dir with a writable directory, or --no-cache",
        ) from None


class _Progress:
    """A bar of judgements done, on a terminal only; silent otherwise."""

    def __init__(self, out: Output, *, total: int) -> None:
        from osmosis.cli.output import Mode

        self._bar: Any = None
        self._task: Any = None
        self.errors = 0
        if out.mode is not Mode.RICH or not out.console.is_terminal:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self._bar = Progress(
            TextColumn("[bold]judging"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[summary]}"),
            console=out.console,
            transient=True,
        )
        self._bar.start()
        self._task = self._bar.add_task("judging", total=total, summary="")

    def advance(self, record: RubricRecord, judgement: Judgement) -> None:
        if judgement.error is not None:
            self.errors += 1
        if self._bar is not None:
            self._bar.update(self._task, advance=1, summary=f"errors {self.errors}")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


# -- presentation -----------------------------------------------------------------------------
def _finish(out: Output, report: RubricReport, *, data_path: str, target_file: Path | None) -> None:
    import datetime
    import json

    from osmosis.cli.output import CLIError, Mode

    document = report.to_document(
        data_path=data_path, generated_at=datetime.datetime.now(datetime.UTC).isoformat()
    )
    if target_file is not None:
        _write(target_file, json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    resource: dict[str, Any] = {
        "model": document["model"],
        "data_path": data_path,
        "number": document["number"],
        "statistics": document["overall_statistics"],
        "self_consistency": document["self_consistency"],
        "record_count": document["record_count"],
        "error_count": document["error_count"],
        "flagged_count": document["flagged_count"],
        "model_calls": document["model_calls"],
        "cache_hits": document["cache_hits"],
        "halted": document["halted"],
    }
    if target_file is not None:
        resource["output_path"] = str(target_file)
    else:
        resource["records"] = document["records"]
    if out.mode is Mode.RICH:
        _show_records(out, document["records"])
    elif out.mode is Mode.PLAIN:
        out.listing(
            [_row(record) for record in document["records"]],
            columns=["index", "label", "average", "stdev", "scores", "errors"],
        )
    message = (
        f"Judged {document['record_count']} records x {document['number']} "
        f"({report.model_calls} model calls, {report.cache_hits} cached)"
        + (f"; results in {target_file}" if target_file is not None else "")
    )
    if out.mode is not Mode.JSON:
        out.detail(_overall(document), title="Overall Statistics")
    if report.halted:
        out.warn(f"stopped calling the judge: {report.halted}")
    if report.error_count:
        raise CLIError(
            "Rubric evaluation completed with errors.",
            code="PLATFORM_ERROR",
            details=resource,
            hint=f"{report.error_count} record(s) have errors; a re-run asks only for those "
            "(verdicts already received are cached)",
        )
    out.operation("eval.rubric", message=message, resource=resource)


def _write(path: Path, text: str) -> None:
    from osmosis.cli.output import CLIError

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        partial.write_text(text, encoding="utf-8")
        partial.replace(path)  # readers never see half a file
    except OSError as error:
        raise CLIError(f"cannot write {path}: {error}") from None


def _show_records(out: Output, records: list[dict[str, Any]]) -> None:
    for record in records:
        lines = [f"{record['label']} (record {record['index']}, line {record['line']})"]
        for judgement in record["judgements"]:
            run = f"  Run {judgement['run']:02d}:"
            if judgement["error"] is not None:
                lines.append(f"{run} error: {judgement['error']}")
                continue
            lines.append(f"{run} score={judgement['score']:.4g}")
            lines.append(f"    explanation: {judgement['explanation']}")
        lines.extend(
            f"  flag: run {flag['run']} score {flag['raw_score']:g} clamped to {flag['score']:g}"
            for flag in record["flags"]
        )
        stats = record["statistics"]
        if stats is not None:
            lines.append(
                f"  Summary: average={stats['average']:.4g} stdev={stats['stdev']:.4g} "
                f"min={stats['min']:.4g} max={stats['max']:.4g}"
            )
        out.console.print("\n".join(lines), markup=False, highlight=False)


def _row(record: dict[str, Any]) -> dict[str, Any]:
    stats = record["statistics"] or {}
    return {
        "index": record["index"],
        "label": record["label"],
        "average": stats.get("average"),
        "stdev": stats.get("stdev"),
        "scores": ",".join(f"{s:g}" for s in record["scores"]) or None,
        "errors": len(record["errors"]),
    }


def _overall(document: dict[str, Any]) -> dict[str, Any]:
    stats = document["overall_statistics"] or {}
    table: dict[str, Any] = {
        "Records": document["record_count"],
        "Judgements Per Record": document["number"],
        "Average": stats.get("average"),
        "Variance": stats.get("variance"),
        "Stdev": stats.get("stdev"),
        "Min": stats.get("min"),
        "Max": stats.get("max"),
    }
    consistency = document["self_consistency"]
    if consistency is not None:
        table["Self-Consistency (mean stdev)"] = consistency["mean_stdev"]
    table["Errors"] = document["error_count"]
    table["Clamped Scores"] = document["flagged_count"]
    table["Model Calls"] = document["model_calls"]
    table["Cached"] = document["cache_hits"]
    return table
