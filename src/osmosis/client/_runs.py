"""`client.runs`: evaluation runs on the platform (`/api/eval-runs`).

`run` is a run's name or id; `git` the workspace identity.

    created = client.runs.submit(git="o/r", body=EvalRunCreate(...))
    client.runs.get(created.name).eval_run.status   # 'pending'
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from osmosis.client._base import Resource, api_error, git_header
from osmosis.vocabulary import MAX_PAGE
from osmosis.wire.runs import (
    AttemptList,
    EvalRunCreate,
    EvalRunCreated,
    EvalRunDetail,
    EvalRunList,
    EvalRunLogs,
    EvalRunOperation,
    EvalRunRetried,
    EvalRunRetry,
    EvalRunStop,
    FileManifest,
)


class Runs(Resource):
    """Submit, follow, stop, retry and download evaluation runs."""

    def submit(self, *, git: str, body: EvalRunCreate) -> EvalRunCreated:
        """Submit an evaluation run of the workspace `git`; the server clones the commit."""
        return self._transport.call(
            "POST", "/api/eval-runs", EvalRunCreated, body=body, headers=git_header(git)
        )

    def list(
        self,
        *,
        git: str | None = None,
        limit: int = MAX_PAGE,
        offset: int = 0,
        all_workspaces: bool = False,
    ) -> EvalRunList:
        """Runs of the workspace `git`, newest first; `all_workspaces`: every workspace of
        the caller (then `git` may be None)."""
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if all_workspaces:
            params["all"] = "true"
        headers = git_header(git) if git else None
        return self._transport.call(
            "GET", "/api/eval-runs", EvalRunList, params=params, headers=headers
        )

    def get(self, run: str) -> EvalRunDetail:
        return self._transport.call("GET", _run_path(run), EvalRunDetail)

    def logs(self, run: str, *, limit: int = 50, cursor: str | None = None) -> EvalRunLogs:
        """Log entries oldest first; pass `next_cursor` back to read on (None at the end)."""
        params: dict[str, Any] = {"limit": limit}
        if cursor:
            params["cursor"] = cursor
        return self._transport.call("GET", _run_path(run, "logs"), EvalRunLogs, params=params)

    def stop(self, run: str) -> EvalRunOperation:
        return self._transport.call(
            "POST", _run_path(run, "stop"), EvalRunOperation, body=EvalRunStop()
        )

    def retry(
        self,
        run: str,
        *,
        secrets: Mapping[str, str] | None = None,
        max_tokens_total: int | None = None,
        max_cost_usd: float | None = None,
        max_model_calls: int | None = None,
    ) -> EvalRunRetried:
        """Re-run the failed and skipped attempts of a finished, failed, stopped or halted
        run; a budget limit given replaces the config's from now on."""
        body = EvalRunRetry(
            secrets=dict(secrets or {}),
            max_tokens_total=max_tokens_total,
            max_cost_usd=max_cost_usd,
            max_model_calls=max_model_calls,
        )
        return self._transport.call("POST", _run_path(run, "retry"), EvalRunRetried, body=body)

    def files(
        self, run: str, *, types: Iterable[str] | None = None, rows: str | None = None
    ) -> FileManifest:
        """The downloadable files (path, size, sha256, type); `types` default to
        metrics and trajectories, `rows` ("3,7,10-20") filters trajectories and artifacts."""
        params: dict[str, Any] = {}
        if types is not None:
            params["types"] = ",".join(types)
        if rows:
            params["rows"] = rows
        return self._transport.call("GET", _run_path(run, "files"), FileManifest, params=params)

    def download_file(self, run: str, path: str, dest: Path) -> int:
        """Stream one file of the run to `dest` (parents created); returns the bytes written.

        No verification here: the caller compares size and sha256 with the manifest.
        """
        url_path = _run_path(run, "files") + "/" + quote(path, safe="/")
        written = 0
        try:
            with self._transport.http.stream("GET", url_path) as response:
                if response.is_error:
                    response.read()
                    raise api_error(response)
                dest.parent.mkdir(parents=True, exist_ok=True)
                with dest.open("wb") as handle:
                    for chunk in response.iter_bytes():
                        handle.write(chunk)
                        written += len(chunk)
        except httpx.HTTPError as error:
            raise self._transport.unreachable(error, url_path) from None
        return written

    def attempts(
        self,
        run: str,
        *,
        limit: int = MAX_PAGE,
        offset: int = 0,
        status: str | None = None,
        min_reward: float | None = None,
        max_reward: float | None = None,
        sort: str | None = None,
    ) -> AttemptList:
        """One page of the run's attempts (for the dashboard); `sort` e.g. "-reward"."""
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        optional = {
            "status": status,
            "min_reward": min_reward,
            "max_reward": max_reward,
            "sort": sort,
        }
        params.update({key: value for key, value in optional.items() if value is not None})
        return self._transport.call("GET", _run_path(run, "attempts"), AttemptList, params=params)


def _run_path(run: str, *parts: str) -> str:
    return "/".join(["/api/eval-runs", quote(run, safe=""), *parts])
