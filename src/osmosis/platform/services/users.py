"""Store functions for users and their tokens. Keyword arguments, no HTTP in sight.

issued = create_user(db, name="ada", email="ada@example.com", is_admin=False)
issued.secret  # the new user's first token, never stored

A token serves requests while it is not revoked, not expired and its user is active
(`ApiToken.is_usable`); `check_token` says which of these failed. Deactivating a user stops
their tokens and dashboard sessions at once and keeps everything else (runs, memberships).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from osmosis.platform.core.db.dialect import lock_rows
from osmosis.platform.core.db.models import ApiToken, User, Workspace, WorkspaceMember, utcnow
from osmosis.platform.core.db.web_models import WebSession
from osmosis.platform.core.errors import AuthRequired, Conflict, NotFound, ValidationFailed
from osmosis.platform.services.token_use import TokenUses
from osmosis.platform.services.tokens import NEVER, hash_token, matches, new_token


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


@dataclass(frozen=True)
class Deactivation:
    """A user just deactivated: the dashboard sessions that ended, and the workspaces that
    have no active owner left (an admin can add one)."""

    user: User
    sessions_ended: int
    workspaces_without_owner: list[str]


def create_user(
    db: Session,
    *,
    name: str,
    email: str | None,
    is_admin: bool,
    token_expires_at: datetime | None = None,
) -> NewUser:
    """Create a user with a first token named "default" (expiring at `token_expires_at`,
    default never); a taken name or email is a Conflict."""
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
    issued = create_token(db, user=user, name="default", expires_at=token_expires_at)
    return NewUser(user=user, issued=issued)


def list_users(db: Session, *, limit: int, offset: int) -> Page:
    users = db.scalars(select(User).order_by(User.created_at, User.id).limit(limit).offset(offset))
    return Page(users=list(users), total_count=count_users(db))


def get_user(db: Session, *, user_id: str, by_name: bool = False) -> User:
    """The user with id `user_id` (or, with `by_name`, that name or email: for admins)."""
    user = db.get(User, user_id)
    if user is None and by_name:
        user = db.scalar(select(User).where(or_(User.name == user_id, User.email == user_id)))
    if user is None:
        named = "id, name or email" if by_name else "id"
        raise NotFound(f"no user with {named} {user_id!r}", details={"user_id": user_id})
    return user


def token_expiry(
    *,
    now: datetime,
    ttl_days: int,
    expires_in: int | str | None,
    cap: datetime | None = None,
) -> datetime | None:
    """When a token created at `now` expires: `expires_in` seconds, `NEVER`, or (None) the
    server's `ttl_days` (0: never). Never later than `cap`, the expiry of the token that
    asks: a short-lived token cannot mint a lasting one."""
    if expires_in == NEVER:
        expires = None
    elif isinstance(expires_in, int):
        expires = now + timedelta(seconds=expires_in)
    else:
        expires = now + timedelta(days=ttl_days) if ttl_days else None
    if cap is not None and (expires is None or expires > cap):
        return cap
    return expires


def create_token(
    db: Session, *, user: User, name: str, expires_at: datetime | None = None
) -> IssuedToken:
    """A new token for `user`; refused (Conflict) while the user is deactivated."""
    if not user.is_active:
        raise Conflict(
            f"user {user.name!r} is deactivated; reactivate them first "
            f"(osmosis admin user reactivate {user.name})",
            details={"user_id": user.id},
        )
    now = utcnow()
    if expires_at is not None and expires_at <= now:
        raise ValidationFailed("a token must expire in the future", details={"field": "expires_in"})
    secret = new_token()
    token = ApiToken(
        user=user, name=name, token_hash=hash_token(secret), created_at=now, expires_at=expires_at
    )
    db.add(token)
    db.flush()
    return IssuedToken(token=token, secret=secret)


def list_tokens(db: Session, *, user: User) -> list[ApiToken]:
    """`user`'s tokens, oldest first, revoked ones included (their `revoked_at` says so)."""
    query = select(ApiToken).where(ApiToken.user_id == user.id)
    return list(db.scalars(query.order_by(ApiToken.created_at, ApiToken.id)))


def _live_admin_tokens(db: Session, *, now: datetime, besides: ApiToken | None = None) -> int:
    """Tokens that can still administer: not revoked or expired, of an active admin."""
    query = (
        select(func.count())
        .select_from(ApiToken)
        .join(User, User.id == ApiToken.user_id)
        .where(
            User.is_admin,
            User.deactivated_at.is_(None),
            ApiToken.revoked_at.is_(None),
            or_(ApiToken.expires_at.is_(None), ApiToken.expires_at > now),
        )
    )
    if besides is not None:
        query = query.where(ApiToken.id != besides.id)
    return db.scalar(query) or 0


def revoke_token(db: Session, *, token_id: str, owner: User | None = None) -> ApiToken:
    """Revoke a token at once (every later request with it is a 401); revoking it again
    changes nothing. With `owner`, only a token of theirs: any other id is `NotFound`, as
    one that does not exist. Refused when it is the last live token of any admin: nobody
    could create users or tokens any more."""
    token = db.get(ApiToken, token_id)
    if token is None or (owner is not None and token.user_id != owner.id):
        raise NotFound(f"no token with id {token_id!r}", details={"token_id": token_id})
    if token.revoked_at is not None:
        return token
    now = utcnow()
    if token.is_usable(now) and token.user.is_admin:
        # Two admins revoking the last two admin tokens at once would each count the other's.
        lock_rows(db, User, User.is_admin.is_(True))
    if (
        token.is_usable(now)
        and token.user.is_admin
        and not _live_admin_tokens(db, now=now, besides=token)
    ):
        raise Conflict(
            "this is the last live admin token; issue another admin token first",
            details={"token_id": token_id},
        )
    token.revoked_at = now
    db.flush()
    return token


def check_token(db: Session, *, secret: str, uses: TokenUses | None = None) -> ApiToken:
    """The token whose hash matches `secret` if it may be used now, else `AuthRequired`
    saying why (unknown or revoked, expired, user deactivated). Reads only: the use is
    noted in `uses`, which writes it later (a full disk must not refuse every request).

    Lookup is by digest, so timing reveals nothing about stored secrets; the final
    compare_digest guards against a backend with case-insensitive string equality.
    """
    token = db.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(secret)))
    if token is None or token.revoked_at is not None or not matches(secret, token.token_hash):
        raise AuthRequired("the API token is not valid or has been revoked")
    now = utcnow()
    if token.expires_at is not None and now >= token.expires_at:
        raise AuthRequired(
            f"the API token {token.name!r} expired at {token.expires_at:%Y-%m-%d %H:%M} UTC; "
            "create another with `osmosis auth token create` (or ask an admin)",
            details={"expired_at": token.expires_at.isoformat()},
        )
    if not token.user.is_active:
        raise AuthRequired("the user of this API token is deactivated; ask an admin")
    if uses is not None:
        uses.record(token, now=now)
    return token


def authenticate(db: Session, *, secret: str, uses: TokenUses | None = None) -> ApiToken | None:
    """The usable token whose hash matches `secret`, or None (see `check_token`)."""
    try:
        return check_token(db, secret=secret, uses=uses)
    except AuthRequired:
        return None


def deactivate_user(db: Session, *, user: User, by: User) -> Deactivation:
    """Stop every token and dashboard session of `user` now; their runs, secrets and
    memberships stay. `by` (an active admin) may not deactivate themselves, so an active
    admin always remains."""
    if user.id == by.id:
        raise Conflict("you cannot deactivate yourself; ask another admin")
    now = utcnow()
    if user.deactivated_at is None:
        user.deactivated_at = now
    tokens = select(ApiToken.id).where(ApiToken.user_id == user.id)
    ended = db.execute(
        update(WebSession)
        .where(WebSession.token_id.in_(tokens), WebSession.ended_at.is_(None))
        .values(ended_at=now)
    )
    db.flush()
    return Deactivation(
        user=user,
        sessions_ended=int(getattr(ended, "rowcount", 0) or 0),
        workspaces_without_owner=_ownerless(db, user=user),
    )


def reactivate_user(db: Session, *, user: User) -> User:
    """Let `user`'s unrevoked, unexpired tokens work again (dashboard sessions stay ended)."""
    user.deactivated_at = None
    db.flush()
    return user


def _ownerless(db: Session, *, user: User) -> list[str]:
    """Identities of the workspaces `user` owns that have no other active owner."""
    owned = select(WorkspaceMember.workspace_id).where(
        WorkspaceMember.user_id == user.id, WorkspaceMember.role == "owner"
    )
    others = (
        select(WorkspaceMember.workspace_id)
        .join(User, User.id == WorkspaceMember.user_id)
        .where(
            WorkspaceMember.role == "owner",
            WorkspaceMember.user_id != user.id,
            User.deactivated_at.is_(None),
        )
    )
    query = select(Workspace.identity).where(Workspace.id.in_(owned), Workspace.id.not_in(others))
    return list(db.scalars(query.order_by(Workspace.identity)))
