"""`osmosis eval`: evaluate rollouts on this machine or on the platform, and read the runs.

Map (one module per command, plus what several of them share):

| module | holds |
|---|---|
| `run.py` | `eval run`: an evaluation on this machine; `progress.py` its live bar |
| `report.py` | what a CI job reads after a run: gates, the Markdown report, JUnit |
| `dataset.py` | `eval run` without a local data file: the platform's dataset, cached |
| `rubric.py` | `eval rubric`: LLM-as-judge scores over recorded attempts |
| `submit.py`, `wait.py` | `eval submit [--wait]`: a platform run, and following it to its end |
| `run_secrets.py` | where a platform run's secrets come from (`submit`, `retry`) |
| `runs.py` | `eval list`, `logs`, `stop`, `retry` |
| `info.py` | `eval info`: one run, from the platform or its local directory |
| `download.py`, `transfer.py` | `eval download`, and its verified, resumable transfer |
| `compare.py`, `upload.py`, `view.py` | `eval compare`, `eval upload`, `eval view` |
| `local_runs.py` | finding and reading local run directories |
| `context.py`, `options.py` | where runs live, a run's URL and times; options spelled alike |

Each command module imports only typer at module level, so `osmosis --help` stays fast; the
engine, the client and the platform load inside the command that uses them. Arrows point
down this table's dependencies only: no command module imports this package or `cli.main`.
"""

from __future__ import annotations

import typer

from osmosis.cli.eval import (
    compare,
    download,
    info,
    rubric,
    run,
    runs,
    submit,
    upload,
    view,
)

app = typer.Typer(help="Evaluate rollouts.", no_args_is_help=True)

app.command("run")(run.run_command)
app.command("rubric")(rubric.rubric_command)
# submit/list/info/logs/stop/retry/download: evaluation runs on the platform.
app.command("submit")(submit.submit_command)
app.command("list")(runs.list_command)
app.command("info")(info.info_command)
app.command("logs")(runs.logs_command)
app.command("stop")(runs.stop_command)
app.command("retry")(runs.retry_command)
app.command("download")(download.download_command)
# compare and upload: reading runs (local, platform or both) rather than running them.
app.command("compare")(compare.compare_command)
app.command("upload")(upload.upload_command)
# view: the dashboard's run pages over local run directories.
app.command("view")(view.view_command)

__all__ = ["app"]
