"""`GET /api/health`: the one route that needs no token (used to wait for start-up)."""

from __future__ import annotations

from fastapi import APIRouter

from osmosis._version import __version__
from osmosis.platform.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/api/health")
def health() -> Health:
    return Health(status="ok", version=__version__)
