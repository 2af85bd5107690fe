"""`PlatformClient`: one connection to a platform, its resources as attributes."""

from __future__ import annotations

from types import TracebackType

import httpx

from osmosis.client._admin import Admin
from osmosis.client._auth import Auth
from osmosis.client._base import Transport
from osmosis.client._datasets import Datasets
from osmosis.client._imports import RunImports
from osmosis.client._runs import Runs
from osmosis.client._secrets import Secrets
from osmosis.client._workspaces import Workspaces
from osmosis.wire import Health


class PlatformClient:
    """The platform API by resource, each method returning the endpoint's pydantic model.

        with PlatformClient("http://127.0.0.1:8765", token="osm_...") as client:
            client.runs.list(git="acme/evals").eval_runs

    Resources mirror the API's routers: `auth`, `admin`, `workspaces`, `secrets`, `datasets`,
    `runs`, and `imports` (local runs uploaded as platform runs). With `workspace=NAME`,
    workspace-scoped requests name that workspace (`X-Osmosis-Workspace`) instead of the
    identity passed as `git=` (`X-Osmosis-Git`).
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        allow_insecure_http: bool = False,
        transport: httpx.BaseTransport | None = None,
        workspace: str | None = None,
    ) -> None:
        self._transport = Transport(
            base_url,
            token,
            timeout=timeout,
            allow_insecure_http=allow_insecure_http,
            transport=transport,
            workspace=workspace,
        )
        self.base_url = self._transport.base_url
        self.auth = Auth(self._transport)
        self.admin = Admin(self._transport)
        self.workspaces = Workspaces(self._transport)
        self.secrets = Secrets(self._transport)
        self.datasets = Datasets(self._transport)
        self.runs = Runs(self._transport)
        self.imports = RunImports(self._transport)

    def health(self) -> Health:
        return self._transport.call("GET", "/api/health", Health)

    def close(self) -> None:
        self._transport.close()

    def __enter__(self) -> PlatformClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
