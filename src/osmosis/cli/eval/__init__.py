"""`osmosis eval`: evaluate rollouts on this machine or on the platform, and read the runs.

Map (one module per command, plus what several of them share):

| module | holds |
|---|---|
| `run.py` | `eval run`: an evaluation on this machine; `progress.py` its live bar |
| `report.py` | what a CI job reads after a run: gates, the Markdown report, JUnit |
| `dataset.py` | `eval run` without a local data file: the platform's dataset, cached |
| `rubric.py` | `eval rubric`: LLM-as-judge scores over recorded attempts |
| `submit.py`, `wait.py` | `eval submit [--wait]`: a platform run, and following it to its end |
| `preflight.py` | the entrypoint's pre-flight import in a child interpreter (`eval submit`) |
| `submit_early.py` | `eval submit`'s pre-flight import, started at the command's entry |
| `run_secrets.py` | where a platform run's secrets come from (`submit`, `retry`) |
| `runs.py` | `eval list`, `logs`, `stop`, `retry` |
| `info.py` | `eval info`: one run, from the platform or its local directory |
| `download.py`, `transfer.py` | `eval download`, and its verified, resumable transfer |
| `compare.py`, `upload.py`, `view.py` | `eval compare`, `eval upload`, `eval view` |
| `local_runs.py` | finding and reading local run directories |
| `context.py`, `options.py` | where runs live, a run's URL and times; options spelled alike |

Each command module imports only typer at module level, so `osmosis --help` stays fast; the
engine, the client and the platform load inside the command that uses them, and `group(name)`
imports only the module of the command named on the line. Arrows point
down this table's dependencies only: no command module imports this package or `cli.main`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

import typer

# The group's commands in the order help lists them: name -> the module that holds it.
_COMMANDS = {
    "run": "run",
    "rubric": "rubric",
    # submit/list/info/logs/stop/retry/download: evaluation runs on the platform.
    "submit": "submit",
    "list": "runs",
    "info": "info",
    "logs": "runs",
    "stop": "runs",
    "retry": "runs",
    "download": "download",
    # compare and upload: reading runs (local, platform or both) rather than running them.
    "compare": "compare",
    "upload": "upload",
    # view: the dashboard's run pages over local run directories.
    "view": "view",
}


@cache
def group(command: str | None = None) -> typer.Typer:
    """The `eval` group; with `command` one of its names, that command alone, and only its
    module imported (`osmosis eval run` loads neither `submit` nor `view`).

        group("run").registered_commands[0].name  # 'run'
    """
    app = typer.Typer(help="Evaluate rollouts.", no_args_is_help=True)
    for name in [command] if command in _COMMANDS else list(_COMMANDS):
        app.command(name)(_callback(name))
    return app


def _callback(name: str) -> Callable[..., Any]:
    match _COMMANDS[name]:
        case "run":
            from osmosis.cli.eval import run

            return run.run_command
        case "rubric":
            from osmosis.cli.eval import rubric

            return rubric.rubric_command
        case "submit":
            from osmosis.cli.eval import submit

            return submit.submit_command
        case "runs":
            from osmosis.cli.eval import runs

            commands: dict[str, Callable[..., Any]] = {
                "list": runs.list_command,
                "logs": runs.logs_command,
                "stop": runs.stop_command,
                "retry": runs.retry_command,
            }
            return commands[name]
        case "info":
            from osmosis.cli.eval import info

            return info.info_command
        case "download":
            from osmosis.cli.eval import download

            return download.download_command
        case "compare":
            from osmosis.cli.eval import compare

            return compare.compare_command
        case "upload":
            from osmosis.cli.eval import upload

            return upload.upload_command
    from osmosis.cli.eval import view

    return view.view_command


def __getattr__(name: str) -> typer.Typer:
    # `app`: the whole group, built when first asked for.
    if name == "app":
        return group()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["app", "group"]
