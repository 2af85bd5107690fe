"""`/api/auth`: who the presented token belongs to."""

from __future__ import annotations

from fastapi import APIRouter

from osmosis.platform import users
from osmosis.platform.deps import CurrentToken, Db
from osmosis.platform.schemas import TokenPublic, UserPublic, WhoAmI

router = APIRouter(prefix="/api/auth", tags=["auth"])


@router.get("/whoami")
def whoami(token: CurrentToken) -> WhoAmI:
    return WhoAmI(
        user=UserPublic.model_validate(token.user), token=TokenPublic.model_validate(token)
    )


@router.delete("/token")
def revoke_own_token(token: CurrentToken, db: Db) -> TokenPublic:
    """Revoke the token this request presents (`osmosis auth logout --revoke`)."""
    revoked = users.revoke_token(db, token_id=token.id)
    public = TokenPublic.model_validate(revoked)
    db.commit()
    return public
