"""Tables as SQLAlchemy 2 models. Portable types only: the same schema runs on PostgreSQL.

Ids are random hex strings rather than counters, so they reveal nothing about how many users
or tokens exist and never collide when data is copied between databases.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    MetaData,
    String,
    Text,
    TypeDecorator,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

# Named constraints keep Alembic migrations reproducible across backends.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def new_id() -> str:
    return uuid.uuid4().hex


def utcnow() -> datetime:
    return datetime.now(UTC)


class UtcDateTime(TypeDecorator[datetime]):
    """An aware UTC timestamp on every backend (SQLite drops the zone; we put it back)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetimes are ambiguous; pass an aware UTC datetime")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class User(Base):
    """A person or service account that holds API tokens.

    A deactivated user (`deactivated_at` set) keeps their rows, runs and memberships, but no
    token of theirs authenticates until an admin reactivates them.
    """

    __tablename__ = "users"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    email: Mapped[str | None] = mapped_column(String(320), unique=True)
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    deactivated_at: Mapped[datetime | None] = mapped_column(UtcDateTime)

    @property
    def is_active(self) -> bool:
        return self.deactivated_at is None

    tokens: Mapped[list[ApiToken]] = relationship(
        back_populates="user", cascade="all, delete-orphan", passive_deletes=True
    )


class ApiToken(Base):
    """A bearer token. Only its SHA-256 is stored; the secret is shown once, at creation."""

    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    user_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("users.id", ondelete="CASCADE"), index=True
    )
    name: Mapped[str] = mapped_column(String(64))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime)

    user: Mapped[User] = relationship(back_populates="tokens")

    def is_usable(self, now: datetime) -> bool:
        """Whether requests with this token are served at `now`: not revoked, not expired,
        its user not deactivated. Dashboard sessions ask the same question."""
        return (
            self.revoked_at is None
            and (self.expires_at is None or now < self.expires_at)
            and self.user.is_active
        )


class Workspace(Base):
    """A git repository's workspace, known by the identity normalised from its `origin`."""

    __tablename__ = "workspaces"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    identity: Mapped[str] = mapped_column(String(1024), unique=True)
    created_by: Mapped[str | None] = mapped_column(
        String(32), ForeignKey("users.id", ondelete="SET NULL")
    )
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    sandbox_network: Mapped[str | None] = mapped_column(String(16), default=None)
    """This workspace's sandbox network (`bridge` | `full`); None: `OSMOSIS_SANDBOX_NETWORK`."""
    # Budgets (issue 28.1): a default for a run whose config sets none of that limit (owners),
    # and a ceiling every run of the workspace is clamped to (admins); None: none.
    budget_default_tokens_total: Mapped[int | None] = mapped_column(BigInteger, default=None)
    budget_default_cost_usd: Mapped[float | None] = mapped_column(Float, default=None)
    budget_default_model_calls: Mapped[int | None] = mapped_column(BigInteger, default=None)
    budget_ceiling_tokens_total: Mapped[int | None] = mapped_column(BigInteger, default=None)
    budget_ceiling_cost_usd: Mapped[float | None] = mapped_column(Float, default=None)
    budget_ceiling_model_calls: Mapped[int | None] = mapped_column(BigInteger, default=None)

    members: Mapped[list[WorkspaceMember]] = relationship(
        back_populates="workspace", cascade="all, delete-orphan", passive_deletes=True
    )


class WorkspaceMember(Base):
    """A user's membership of a workspace; `role` is "owner" (adds, removes and changes
    members) or "member"."""

    __tablename__ = "workspace_members"

    workspace_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("workspaces.id", ondelete="CASCADE"), primary_key=True
    )
    user_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("users.id", ondelete="CASCADE"), primary_key=True, index=True
    )
    role: Mapped[str] = mapped_column(String(16), default="member")
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)

    workspace: Mapped[Workspace] = relationship(back_populates="members")
    user: Mapped[User] = relationship()


class Secret(Base):
    """A named secret of a workspace: shared ("workspace") or one user's own ("user").

    Only the Fernet ciphertext is stored. Uniqueness is per (workspace, scope, owner, name);
    two partial indexes express it, because a plain unique constraint treats the NULL owner
    of every workspace secret as distinct.
    """

    __tablename__ = "secrets"
    __table_args__ = (
        CheckConstraint("scope IN ('user', 'workspace')", name="scope"),
        CheckConstraint(
            "(scope = 'user' AND owner_id IS NOT NULL) "
            "OR (scope = 'workspace' AND owner_id IS NULL)",
            name="owner_matches_scope",
        ),
        Index(
            "uq_secrets_workspace_name",
            "workspace_id",
            "name",
            unique=True,
            sqlite_where=text("scope = 'workspace'"),
            postgresql_where=text("scope = 'workspace'"),
        ),
        Index(
            "uq_secrets_user_name",
            "workspace_id",
            "owner_id",
            "name",
            unique=True,
            sqlite_where=text("scope = 'user'"),
            postgresql_where=text("scope = 'user'"),
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(255))
    scope: Mapped[str] = mapped_column(String(16))
    workspace_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("workspaces.id", ondelete="CASCADE"), index=True
    )
    owner_id: Mapped[str | None] = mapped_column(
        String(32), ForeignKey("users.id", ondelete="CASCADE")
    )
    ciphertext: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    updated_by: Mapped[str | None] = mapped_column(
        String(32), ForeignKey("users.id", ondelete="SET NULL")
    )

    updater: Mapped[User | None] = relationship(foreign_keys=[updated_by])
