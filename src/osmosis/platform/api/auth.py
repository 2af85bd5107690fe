"""`/api/auth`: who the presented token belongs to, and the caller's own tokens."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request

from osmosis.platform.core.db.models import ApiToken, utcnow
from osmosis.platform.deps import CurrentToken, CurrentUser, Db, Uses
from osmosis.platform.services import users
from osmosis.platform.services.token_use import TokenUses
from osmosis.wire import (
    TokenCreate,
    TokenCreated,
    TokenList,
    TokenPublic,
    UserPublic,
    WhoAmI,
)

router = APIRouter(prefix="/api/auth", tags=["auth"])

TokenId = Annotated[str, Path(min_length=1, max_length=64, description="The token's id.")]


def token_public(token: ApiToken, uses: TokenUses) -> TokenPublic:
    """A token's metadata, its last use counted even before it is written."""
    public = TokenPublic.model_validate(token)
    return public.model_copy(update={"last_used_at": uses.last_used(token)})


def created(issued: users.IssuedToken) -> TokenCreated:
    """The response for a new token: its metadata and, this once, its secret."""
    token = issued.token
    return TokenCreated(
        id=token.id,
        user_id=token.user_id,
        name=token.name,
        created_at=token.created_at,
        expires_at=token.expires_at,
        token=issued.secret,
    )


@router.get("/whoami")
def whoami(token: CurrentToken, uses: Uses) -> WhoAmI:
    return WhoAmI(user=UserPublic.model_validate(token.user), token=token_public(token, uses))


@router.delete("/token")
def revoke_own_token(token: CurrentToken, db: Db) -> TokenPublic:
    """Revoke the token this request presents (`osmosis auth logout --revoke`)."""
    revoked = users.revoke_token(db, token_id=token.id)
    public = TokenPublic.model_validate(revoked)
    db.commit()
    return public


@router.get("/tokens")
def list_own_tokens(db: Db, user: CurrentUser, uses: Uses) -> TokenList:
    """Your tokens: names, dates, last use, expiry and revocation; never their secrets."""
    return TokenList(tokens=[token_public(t, uses) for t in users.list_tokens(db, user=user)])


@router.post("/tokens", status_code=201)
def create_own_token(
    body: TokenCreate, db: Db, token: CurrentToken, request: Request
) -> TokenCreated:
    """A new token of yours (`osmosis auth token create`). It expires after `expires_in`
    seconds, or the server's OSMOSIS_TOKEN_TTL_DAYS, and never after the token asking."""
    expires = users.token_expiry(
        now=utcnow(),
        ttl_days=request.app.state.settings.token_ttl_days,
        expires_in=body.expires_in,
        cap=token.expires_at,
    )
    issued = users.create_token(db, user=token.user, name=body.name, expires_at=expires)
    db.commit()
    return created(issued)


@router.delete("/tokens/{token_id}")
def revoke_one_of_own_tokens(token_id: TokenId, db: Db, user: CurrentUser) -> TokenPublic:
    """Revoke one of your tokens; another user's token id is a 404, as an unknown one."""
    revoked = users.revoke_token(db, token_id=token_id, owner=user)
    public = TokenPublic.model_validate(revoked)
    db.commit()
    return public
