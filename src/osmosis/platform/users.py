"""Store functions for users and their tokens. Keyword arguments, no HTTP in sight.

issued = create_user(db, name="ada", email="ada@example.com", is_admin=False)
issued.secret  # the new user's first token, never stored
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from osmosis.platform.db.models import ApiToken, User, utcnow
from osmosis.platform.errors import Conflict, NotFound
from osmosis.platform.tokens import hash_token, matches, new_token

# Recording every use would turn each read into a write; a minute's precision is plenty.
LAST_USED_PRECISION = timedelta(minutes=1)


@dataclass(frozen=True)
class IssuedToken:
    """A token just created: the row, and its secret (the only time it exists in clear)."""

    token: ApiToken
    secret: str


@dataclass(frozen=True)
class NewUser:
    user: User
    issued: IssuedToken


@dataclass(frozen=True)
class Page:
    users: list[User]
    total_count: int


def count_users(db: Session) -> int:
    return db.scalar(select(func.count()).select_from(User)) or 0


def create_user(db: Session, *, name: str, email: str | None, is_admin: bool) -> NewUser:
    """Create a user with a first token named "default"; a taken name or email is a Conflict."""
    clash = User.name == name if email is None else (User.name == name) | (User.email == email)
    taken = db.scalar(select(User).where(clash).limit(1))
    if taken is not None:
        field, value = ("name", name) if taken.name == name else ("email", email)
        raise Conflict(f"a user with {field} {value!r} already exists", details={"field": field})
    user = User(name=name, email=email, is_admin=is_admin, created_at=utcnow())
    db.add(user)
    try:
        db.flush()
    except IntegrityError:  # a concurrent request won the race for the same name
        db.rollback()
        raise Conflict("a user with this name or email already exists") from None
    return NewUser(user=user, issued=create_token(db, user=user, name="default"))


def list_users(db: Session, *, limit: int, offset: int) -> Page:
    users = db.scalars(select(User).order_by(User.created_at, User.id).limit(limit).offset(offset))
    return Page(users=list(users), total_count=count_users(db))


def get_user(db: Session, *, user_id: str) -> User:
    user = db.get(User, user_id)
    if user is None:
        raise NotFound(f"no user with id {user_id!r}", details={"user_id": user_id})
    return user


def create_token(db: Session, *, user: User, name: str) -> IssuedToken:
    secret = new_token()
    token = ApiToken(user=user, name=name, token_hash=hash_token(secret), created_at=utcnow())
    db.add(token)
    db.flush()
    return IssuedToken(token=token, secret=secret)


def list_tokens(db: Session, *, user: User) -> list[ApiToken]:
    """`user`'s tokens, oldest first, revoked ones included (their `revoked_at` says so)."""
    query = select(ApiToken).where(ApiToken.user_id == user.id)
    return list(db.scalars(query.order_by(ApiToken.created_at, ApiToken.id)))


def revoke_token(db: Session, *, token_id: str) -> ApiToken:
    """Revoke a token at once (every later request with it is a 401); revoking it again
    changes nothing. Refused when it is the last live token of any admin: nobody could
    create users or tokens any more."""
    token = db.get(ApiToken, token_id)
    if token is None:
        raise NotFound(f"no token with id {token_id!r}", details={"token_id": token_id})
    if token.revoked_at is not None:
        return token
    if token.user.is_admin:
        others = db.scalar(
            select(func.count())
            .select_from(ApiToken)
            .join(User, User.id == ApiToken.user_id)
            .where(User.is_admin, ApiToken.revoked_at.is_(None), ApiToken.id != token.id)
        )
        if not others:
            raise Conflict(
                "this is the last live admin token; issue another admin token first",
                details={"token_id": token_id},
            )
    token.revoked_at = utcnow()
    db.flush()
    return token


def authenticate(db: Session, *, secret: str) -> ApiToken | None:
    """The live token whose hash matches `secret`, or None.

    Lookup is by digest, so timing reveals nothing about stored secrets; the final
    compare_digest guards against a backend with case-insensitive string equality.
    """
    token = db.scalar(
        select(ApiToken).where(
            ApiToken.token_hash == hash_token(secret), ApiToken.revoked_at.is_(None)
        )
    )
    if token is None or not matches(secret, token.token_hash):
        return None
    now = utcnow()
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_PRECISION:
        token.last_used_at = now
        db.commit()
    return token
