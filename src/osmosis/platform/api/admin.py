"""`/api/admin`: user and token management, for admin users only."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request

from osmosis.platform.api.auth import created, token_public
from osmosis.platform.core.db.models import utcnow
from osmosis.platform.deps import AdminUser, Db, Offset, Uses
from osmosis.platform.services import users
from osmosis.vocabulary import MAX_PAGE
from osmosis.wire import (
    TokenCreate,
    TokenCreated,
    TokenList,
    TokenPublic,
    UserCreate,
    UserCreated,
    UserDeactivated,
    UserList,
    UserPublic,
)

router = APIRouter(prefix="/api/admin", tags=["admin"])

UserRef = Annotated[
    str, Path(min_length=1, max_length=320, description="The user's id (or name or email).")
]


def _ttl_days(request: Request) -> int:
    days: int = request.app.state.settings.token_ttl_days
    return days


@router.post("/users", status_code=201)
def create_user(body: UserCreate, db: Db, admin: AdminUser, request: Request) -> UserCreated:
    """Create a user and their first token (it expires after OSMOSIS_TOKEN_TTL_DAYS)."""
    expires = users.token_expiry(now=utcnow(), ttl_days=_ttl_days(request), expires_in=None)
    new = users.create_user(
        db, name=body.name, email=body.email, is_admin=body.is_admin, token_expires_at=expires
    )
    db.commit()
    return UserCreated(user=UserPublic.model_validate(new.user), token=created(new.issued))


@router.get("/users")
def list_users(
    db: Db,
    admin: AdminUser,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = MAX_PAGE,
    offset: Offset = 0,
) -> UserList:
    page = users.list_users(db, limit=limit, offset=offset)
    has_more = offset + len(page.users) < page.total_count
    return UserList(
        users=[UserPublic.model_validate(user) for user in page.users],
        total_count=page.total_count,
        has_more=has_more,
        next_offset=offset + len(page.users) if has_more else None,
    )


@router.post("/users/{user_id}/deactivate")
def deactivate_user(user_id: UserRef, db: Db, admin: AdminUser) -> UserDeactivated:
    """Stop the user's tokens and dashboard sessions at once; their runs and memberships
    stay. Not yourself (so an active admin always remains)."""
    user = users.get_user(db, user_id=user_id, by_name=True)
    done = users.deactivate_user(db, user=user, by=admin)
    db.commit()
    return UserDeactivated(
        user=UserPublic.model_validate(done.user),
        sessions_ended=done.sessions_ended,
        workspaces_without_owner=done.workspaces_without_owner,
    )


@router.post("/users/{user_id}/reactivate")
def reactivate_user(user_id: UserRef, db: Db, admin: AdminUser) -> UserPublic:
    """Let the user's unrevoked, unexpired tokens work again."""
    user = users.reactivate_user(db, user=users.get_user(db, user_id=user_id, by_name=True))
    db.commit()
    return UserPublic.model_validate(user)


@router.post("/users/{user_id}/tokens", status_code=201)
def create_token(
    user_id: str, body: TokenCreate, db: Db, admin: AdminUser, request: Request
) -> TokenCreated:
    user = users.get_user(db, user_id=user_id)
    expires = users.token_expiry(
        now=utcnow(), ttl_days=_ttl_days(request), expires_in=body.expires_in
    )
    issued = users.create_token(db, user=user, name=body.name, expires_at=expires)
    db.commit()
    return created(issued)


@router.get("/users/{user_id}/tokens")
def list_tokens(user_id: str, db: Db, admin: AdminUser, uses: Uses) -> TokenList:
    """A user's tokens: names, dates, last use, expiry and revocation; never their secrets."""
    user = users.get_user(db, user_id=user_id)
    return TokenList(tokens=[token_public(t, uses) for t in users.list_tokens(db, user=user)])


@router.delete("/tokens/{token_id}")
def revoke_token(token_id: str, db: Db, admin: AdminUser) -> TokenPublic:
    """Revoke any user's token; requests made with it fail with 401 from now on."""
    token = users.revoke_token(db, token_id=token_id)
    public = TokenPublic.model_validate(token)
    db.commit()
    return public
