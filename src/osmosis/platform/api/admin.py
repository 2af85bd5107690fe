"""`/api/admin`: user and token management, for admin users only."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from osmosis.platform import users
from osmosis.platform.deps import AdminUser, Db, Offset
from osmosis.platform.schemas import (
    TokenCreate,
    TokenCreated,
    TokenList,
    TokenPublic,
    UserCreate,
    UserCreated,
    UserList,
    UserPublic,
)

router = APIRouter(prefix="/api/admin", tags=["admin"])

MAX_PAGE = 50


def _created(issued: users.IssuedToken) -> TokenCreated:
    token = issued.token
    return TokenCreated(
        id=token.id,
        user_id=token.user_id,
        name=token.name,
        created_at=token.created_at,
        token=issued.secret,
    )


@router.post("/users", status_code=201)
def create_user(body: UserCreate, db: Db, admin: AdminUser) -> UserCreated:
    new = users.create_user(db, name=body.name, email=body.email, is_admin=body.is_admin)
    db.commit()
    return UserCreated(user=UserPublic.model_validate(new.user), token=_created(new.issued))


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


@router.post("/users/{user_id}/tokens", status_code=201)
def create_token(user_id: str, body: TokenCreate, db: Db, admin: AdminUser) -> TokenCreated:
    user = users.get_user(db, user_id=user_id)
    issued = users.create_token(db, user=user, name=body.name)
    db.commit()
    return _created(issued)


@router.get("/users/{user_id}/tokens")
def list_tokens(user_id: str, db: Db, admin: AdminUser) -> TokenList:
    """A user's tokens: names, dates, last use and revocation; never their secrets."""
    user = users.get_user(db, user_id=user_id)
    return TokenList(
        tokens=[TokenPublic.model_validate(t) for t in users.list_tokens(db, user=user)]
    )


@router.delete("/tokens/{token_id}")
def revoke_token(token_id: str, db: Db, admin: AdminUser) -> TokenPublic:
    """Revoke any user's token; requests made with it fail with 401 from now on."""
    token = users.revoke_token(db, token_id=token_id)
    public = TokenPublic.model_validate(token)
    db.commit()
    return public
