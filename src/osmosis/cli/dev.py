"""`osmosis dev`: developer utilities (the scripted model server)."""

from __future__ import annotations

import typer

app = typer.Typer(help="Developer utilities.", no_args_is_help=True)


@app.command("fake-model")
def fake_model(
    port: int = typer.Option(0, "--port", help="Port to listen on; 0 (default) picks a free one."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    latency: float = typer.Option(0.0, "--latency", help="Seconds to wait before each answer."),
    wrong_rate: float = typer.Option(
        0.0, "--wrong-rate", help="Share of arithmetic prompts answered wrong."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed for which prompts are wrong or fail."),
    error_rate: float = typer.Option(
        0.0, "--error-rate", help="Share of chat requests answered with an error."
    ),
    error_status: int = typer.Option(
        429, "--error-status", help="HTTP status of injected errors (e.g. 429 or 500)."
    ),
    retry_after: float = typer.Option(
        1.0, "--retry-after", help="Seconds advertised in Retry-After on 429/503."
    ),
    model: str = typer.Option("fake-model", "--model", help="Model id listed by GET /v1/models."),
    rate_limit: float = typer.Option(
        0.0, "--rate-limit", help="Most chat requests accepted per second; above it 429 (0: none)."
    ),
    judge: bool = typer.Option(
        False,
        "--judge",
        help="Also answer `osmosis eval rubric` judge prompts with verdicts, so a rubric can "
        "be tried offline.",
    ),
    verdicts: list[str] = typer.Option(
        [],
        "--verdict",
        metavar="TEXT=SCORE",
        help="With --judge: a candidate containing TEXT gets SCORE (repeatable; first match wins).",
    ),
    judge_score: float = typer.Option(
        1.0, "--judge-score", help="With --judge: the score of every other candidate."
    ),
) -> None:
    """Serve a deterministic OpenAI-compatible model until Ctrl-C.

    Prints the base URL (http://HOST:PORT/v1) first. It calls the first offered tool, answers
    arithmetic ("What is 17 * 23?" -> 391) and echoes anything else. With --judge it answers
    judge prompts as `{"score", "explanation"}` (see --verdict). GET /stats counts requests.
    """
    # Imported here, not at module level: `osmosis --help` must not pay for the server.
    import asyncio
    import signal
    import sys

    from osmosis.cli.output import CLIError, Mode, output
    from osmosis.testing import FakeModelServer, JudgeScript

    out = output()
    if (verdicts or judge_score != 1.0) and not judge:
        raise CLIError("--verdict and --judge-score need --judge", hint="add --judge")
    scores = _parse_verdicts(verdicts)
    script = (
        JudgeScript(scores, default=judge_score, explanation="scripted verdict").rules()
        if judge
        else []
    )
    try:
        server = FakeModelServer(
            host=host,
            port=port,
            latency=latency,
            wrong_rate=wrong_rate,
            seed=seed,
            error_rate=error_rate,
            error_status=error_status,
            retry_after=retry_after,
            model=model,
            script=script,
            rate_limit=rate_limit,
        )
    except ValueError as error:
        raise CLIError(str(error), code="VALIDATION") from None

    async def serve() -> int:
        loop = asyncio.get_running_loop()
        stopped: asyncio.Future[int] = loop.create_future()

        def stop(code: int) -> None:
            if not stopped.done():
                stopped.set_result(code)

        # SIGTERM is a requested stop (exit 0); Ctrl-C is an interruption (exit 130).
        loop.add_signal_handler(signal.SIGTERM, stop, 0)
        loop.add_signal_handler(signal.SIGINT, stop, 130)
        try:
            await server.start_async()
        except OSError as error:
            raise CLIError(
                f"cannot listen on {host}:{port}: {error.strerror or error}",
                code="CONFLICT",
                hint="choose another --port, or --port 0 for a free one",
            ) from None
        try:
            if out.mode is Mode.JSON:
                out.detail({"base_url": server.base_url, "url": server.url, "port": server.port})
            else:
                out.console.print(server.base_url, markup=False, highlight=False, soft_wrap=True)
                out.err_console.print(
                    f"fake model serving; stats at {server.url}/stats; Ctrl-C to stop",
                    markup=False,
                    highlight=False,
                )
            sys.stdout.flush()  # whoever started us waits for this line on a pipe
            return await stopped
        finally:
            await server.stop_async()

    code = asyncio.run(serve())
    if code:
        raise typer.Exit(code)


def _parse_verdicts(values: list[str]) -> dict[str, float]:
    """`--verdict TEXT=SCORE` values as {TEXT: SCORE}; every bad one is reported at once."""
    import math

    from osmosis.cli.output import CLIError

    scores: dict[str, float] = {}
    problems: list[str] = []
    for value in values:
        text, _, score = value.rpartition("=")
        try:
            number = float(score)
        except ValueError:
            number = math.nan
        if not text or not math.isfinite(number):
            problems.append(f"--verdict {value!r}: expected TEXT=SCORE, e.g. Paris=1.0")
        else:
            scores[text] = number
    if problems:
        raise CLIError("; ".join(problems), details={"problems": problems})
    return scores
