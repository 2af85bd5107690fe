"""Wire models of the platform API, named by direction: `...Create` in, `...Public` out.

The typed client (`osmosis.client`) parses responses with these same classes, so the server
and the CLI cannot drift apart. Pydantic only: importing this module pulls in no server code.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Name = Annotated[
    str,
    Field(
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        description="Letters, digits, '_', '.', '-'; starts with a letter or digit.",
        examples=["ada"],
    ),
]
Email = Annotated[
    str,
    Field(
        min_length=3,
        max_length=320,
        pattern=r"^[^@\s]+@[^@\s]+$",
        description="An email address: name@domain, no spaces.",
        examples=["ada@example.com"],
    ),
]


class _Model(BaseModel):
    model_config = ConfigDict(from_attributes=True, extra="ignore")


class _Strict(BaseModel):
    # Request bodies reject unknown fields: a typo should fail loudly, not be ignored.
    model_config = ConfigDict(extra="forbid")


class Health(_Model):
    status: str = "ok"
    version: str


class UserCreate(_Strict):
    name: Name
    email: Email | None = None
    is_admin: bool = False


class UserPublic(_Model):
    id: str
    name: str
    email: str | None
    is_admin: bool
    created_at: datetime


class TokenCreate(_Strict):
    name: Name = "default"


class TokenPublic(_Model):
    """A token's metadata; never its secret."""

    id: str
    name: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


class TokenList(_Model):
    """A user's tokens (metadata only), oldest first."""

    tokens: list[TokenPublic]


class TokenCreated(_Model):
    """A new token, with its secret: returned exactly once."""

    id: str
    user_id: str
    name: str
    created_at: datetime
    token: str


class UserCreated(_Model):
    user: UserPublic
    token: TokenCreated


class UserList(_Model):
    users: list[UserPublic]
    total_count: int
    has_more: bool
    next_offset: int | None


class WhoAmI(_Model):
    user: UserPublic
    token: TokenPublic


class ErrorInfo(_Model):
    code: str
    message: str
    details: dict[str, Any] = {}


class ErrorBody(_Model):
    """Every error response: `{"error": {"code", "message", "details"}}`."""

    error: ErrorInfo


# -- workspaces and secrets ----------------------------------------------------------------
SECRET_NAME_PATTERN = r"^[A-Z][A-Z0-9_]*$"
SECRET_NAME_MAX = 255
# Requests accept the CLI's word "personal" as well as the wire's "user"; responses say "user".
SecretScopeIn = Literal["personal", "user", "workspace"]
SecretScope = Literal["user", "workspace"]


class WorkspaceMemberPublic(_Model):
    user_id: str
    name: str
    email: str | None
    role: str
    added_at: datetime


class WorkspacePublic(_Model):
    """A workspace the caller belongs to, with its members."""

    id: str
    identity: str
    created_at: datetime
    created_by: str | None
    role: str
    members: list[WorkspaceMemberPublic]


class MemberAdd(_Strict):
    """Add an existing user by id or email (exactly one)."""

    user_id: str | None = Field(default=None, max_length=32)
    email: Email | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> MemberAdd:
        if (self.user_id is None) == (self.email is None):
            raise ValueError("give exactly one of user_id or email")
        return self


class SecretCreate(_Strict):
    """Create or replace a secret. The value is write-only: no response ever contains it."""

    value: str = Field(min_length=1, max_length=65536)
    scope: SecretScopeIn = "user"


class SecretPublic(_Model):
    """A secret's metadata; never its value."""

    name: str
    scope: SecretScope
    created_at: datetime
    updated_at: datetime
    updated_by: str | None


class SecretList(_Model):
    secrets: list[SecretPublic]
    total_count: int
    has_more: bool = False
    next_offset: int | None = None
    workspace: str
