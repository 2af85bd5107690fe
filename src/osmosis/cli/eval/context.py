"""What the eval commands about runs share: where runs live, a run's address, its times.

    root = runs_root(None)                      # <workspace>/.osmosis/evals, else ./.osmosis/evals
    run_url("http://127.0.0.1:8765", "qa-1")    # the run's dashboard page
    when(detail.eval_run.created_at)            # '2025-01-31 14:02:11', local time

Standard library only at module level; everything else is imported where it is used.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from osmosis.client import PlatformClient
    from osmosis.workspace import Workspace


def aware(value: Any) -> Any:
    """A naive timestamp from the platform is UTC."""
    from datetime import UTC

    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def when(value: Any) -> str | None:
    """A timestamp as local `YYYY-MM-DD HH:MM:SS`, or None."""
    if value is None:
        return None
    return str(aware(value).astimezone().strftime("%Y-%m-%d %H:%M:%S"))


def run_url(base_url: str, name: str) -> str:
    """The run's page on the platform's dashboard."""
    from urllib.parse import quote

    return f"{base_url.rstrip('/')}/runs/{quote(name, safe='')}"


def optional_workspace() -> Workspace | None:
    from osmosis.workspace import WorkspaceError, resolve_workspace

    try:
        return resolve_workspace(Path.cwd())
    except WorkspaceError:
        return None


def envelope_context(workspace: Workspace | None, client: PlatformClient) -> dict[str, Any]:
    from osmosis.cli.workspace import git_context

    if workspace is None:
        return {"platform_url": client.base_url}
    return git_context(workspace, client.base_url)


def runs_root(output_root: Path | None) -> Path:
    """Where run directories go: -o ROOT itself (as for `eval run -o`), else `.osmosis/evals`
    under the workspace's top level, else under the cwd."""
    if output_root is not None:
        return output_root
    workspace = optional_workspace()
    base = workspace.directory if workspace is not None else Path.cwd()
    return base / ".osmosis" / "evals"
