"""`/api/cli`: the routes the official `osmosis` CLI (osmosis-ai 0.3.x) calls, served from our
services (not a proxy), so that CLI drives this server unchanged.

A map of the room:

| module | holds |
|---|---|
| `errors.py` | the route class: flat `{code, message, ...}` errors, version headers, 426 |
| `deps.py` | the workspace from `X-Osmosis-Git` or `X-Osmosis-Workspace` |
| `account.py` | `verify`, `workspaces`, `tokens/{id}` (`auth login --token`, `whoami`, `logout`) |
| `device.py` | `device/authorize`, `device/token`: browser login (`auth login`), RFC 8628 |
| `secrets.py` | `environment-secrets` (`secret list/set/delete`) |
| `datasets.py` | `datasets` (`dataset upload/list/info/download/logs/preview`) |
| `eval_runs.py` | `eval-runs` (`eval submit/list/info/logs/stop/retry/download`) |
| `run_imports.py` | `eval-runs/imports` (`eval upload`, either local-run layout) |
| `transfers.py` | the capability URLs' targets: no token, a signature instead |
| `unoffered.py` | training, models, benchmarks...: 501 `NOT_OFFERED`; any other path: 404 |

Shapes live in `osmosis.wire.official`. `install(app)` mounts it all:

    install(app)  # in create_app, after the app's own routers
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, FastAPI

from osmosis.platform.deps import current_token
from osmosis.platform.services.capability_urls import CapabilitySigner, signing_key

from . import account, datasets, device, eval_runs, run_imports, secrets, transfers, unoffered
from .errors import OfficialRoute

PREFIX = "/api/cli"


def build_router() -> APIRouter:
    """Every `/api/cli` route; those behind a token first, then the open ones."""
    router = APIRouter(prefix=PREFIX, tags=["official cli"], route_class=OfficialRoute)
    signed_in = APIRouter(route_class=OfficialRoute, dependencies=[Depends(current_token)])
    parts = (account.router, secrets.router, datasets.router, run_imports.router, eval_runs.router)
    for part in parts:
        signed_in.include_router(part)
    router.include_router(signed_in)
    router.include_router(transfers.router)  # the URL's signature stands in for a token
    router.include_router(device.router)  # the device code stands in for a token
    router.include_router(unoffered.router)
    router.add_api_route(
        "/{rest:path}",
        unoffered.unknown_route,
        methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
        include_in_schema=False,
    )
    return router


def install(app: FastAPI) -> None:
    """Mount `/api/cli` on `app`, with the capability URL signer its transfers need."""
    app.state.capability_signer = CapabilitySigner(signing_key(app.state.settings))
    # Not in our OpenAPI document: this is the reference client's contract, with its own
    # error shape, described in docs/platform.md ("Using the official Osmosis CLI").
    app.include_router(build_router(), include_in_schema=False)


__all__ = ["PREFIX", "build_router", "install"]
