"""`osmosis eval view [DIR]`: the dashboard's run pages over local run directories.

Read-only and without login, so it listens on loopback unless `--host` names another
interface; on loopback it answers only requests addressed to a loopback name. Typer only at
module level: FastAPI and uvicorn load when the viewer starts.
"""

from __future__ import annotations

import errno
import socket
from pathlib import Path

import typer

DEFAULT_PORT = 8766


def view_command(
    directory: str | None = typer.Argument(
        None,
        help="A run directory, a directory of runs, or a run name "
        "(default <workspace>/.osmosis/evals).",
    ),
    host: str = typer.Option(
        "127.0.0.1",
        "--host",
        help="Interface to listen on. Anything but loopback shows your runs to whoever can "
        "reach it: there is no login.",
    ),
    port: int = typer.Option(
        DEFAULT_PORT, "--port", help=f"Port to listen on (default {DEFAULT_PORT}; 0 picks one)."
    ),
) -> None:
    """Browse local runs in the dashboard, read-only, live while a run is going."""
    import uvicorn

    from osmosis.cli.output import CLIError, output
    from osmosis.loopback import is_loopback
    from osmosis.platform import local_view

    out = output()
    root = _resolve(directory)
    if not 0 <= port <= 65535:
        raise CLIError(f"--port must be 0-65535; got {port}", details={"port": port})
    loopback = is_loopback(host)
    listener = _listen(host, port)
    bound = listener.getsockname()[1]
    shown_host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    url = f"http://{shown_host}:{bound}/"
    view = local_view(root, host=host)
    count = view.run_count
    if not loopback:
        out.warn(
            f"listening on {host}: anyone who can reach {url} can read these runs "
            "(there is no login)"
        )
    what = f"run {root.name}" if view.single else f"{count} run{'s' if count != 1 else ''}"
    out.info(f"Viewing {what} in {root} at {url} (read-only); Ctrl-C stops it.")
    server = uvicorn.Server(uvicorn.Config(view.app, log_level="warning", access_log=False))
    try:
        server.run(sockets=[listener])
    finally:
        listener.close()


def _resolve(directory: str | None) -> Path:
    """The directory to serve: as given, or a run name under the default root."""
    from osmosis.cli.output import CLIError

    default = _default_root()
    if directory is None:
        if not default.is_dir():
            raise CLIError(
                f"no local runs: {default} does not exist",
                code="NOT_FOUND",
                hint="`osmosis eval run configs/eval/NAME.toml` writes one; or name a directory",
            )
        return default
    given = Path(directory).expanduser()
    if given.is_dir():
        return given
    looked = [str(given.resolve())]
    if "/" not in directory and not directory.startswith("."):  # a run's name
        named = default / directory
        if named.is_dir():
            return named
        looked.append(str(named))
    raise CLIError(
        f"no run directory {directory!r} (looked at {' and '.join(looked)})",
        code="NOT_FOUND",
        hint="pass a run directory, .osmosis/evals, or the name of a run under it",
    )


def _default_root() -> Path:
    from osmosis.workspace import WorkspaceError, find_top_level

    try:
        top = find_top_level(Path.cwd())
    except WorkspaceError:
        top = Path.cwd()  # not in a git work tree: the runs `eval run -o` may have put here
    return top / ".osmosis" / "evals"


def _listen(host: str, port: int) -> socket.socket:
    from osmosis.cli.output import CLIError

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host.strip("[]"), port))
    except OSError as error:
        listener.close()
        raise CLIError(
            f"cannot listen on {host}:{port}: {error.strerror}",
            code="CONFLICT" if error.errno == errno.EADDRINUSE else "VALIDATION",
            hint="choose another port with --port (0 picks a free one)",
        ) from None
    listener.listen(128)
    return listener
