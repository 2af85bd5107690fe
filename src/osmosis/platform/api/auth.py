"""`/api/auth`: who the presented token belongs to."""

from __future__ import annotations

from fastapi import APIRouter

from osmosis.platform.deps import CurrentToken
from osmosis.platform.schemas import TokenPublic, UserPublic, WhoAmI

router = APIRouter(prefix="/api/auth", tags=["auth"])


@router.get("/whoami")
def whoami(token: CurrentToken) -> WhoAmI:
    return WhoAmI(
        user=UserPublic.model_validate(token.user), token=TokenPublic.model_validate(token)
    )
