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
) -> None:
    """Serve a deterministic OpenAI-compatible model until Ctrl-C.

    Prints the base URL (http://HOST:PORT/v1) first. It calls the first offered tool, answers
    arithmetic ("What is 17 * 23?" -> 391) and echoes anything else. GET /stats counts requests.
    """
    # Imported here, not at module level: `osmosis --help` must not pay for the server.
    import asyncio
    import signal
    import sys

    from osmosis.cli.main import output
    from osmosis.cli.output import CLIError, Mode
    from osmosis.testing import FakeModelServer

    out = output()
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
