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
        # No control characters either: NUL cannot be stored in PostgreSQL text.
        pattern=r"^[^@\s\x00-\x1f\x7f]+@[^@\s\x00-\x1f\x7f]+$",
        description="An email address: name@domain, no spaces or control characters.",
        examples=["ada@example.com"],
    ),
]


class _Model(BaseModel):
    model_config = ConfigDict(from_attributes=True, extra="ignore")


class _Strict(BaseModel):
    # Request bodies reject unknown fields: a typo should fail loudly, not be ignored.
    model_config = ConfigDict(extra="forbid")


class DiskPublic(_Model):
    free_bytes: int = Field(description="Free bytes on the disk that holds the platform's home.")
    total_bytes: int
    min_free_bytes: int = Field(description="OSMOSIS_MIN_FREE_DISK_BYTES: no run starts below.")


class ComponentHealth(_Model):
    ok: bool | None = Field(description="Answered just now; null: not checked yet.")
    latency_ms: float | None = None
    checked_s_ago: float | None = Field(default=None, description="Age of this answer.")
    error: str | None = None
    detail: dict[str, str] = Field(default_factory=dict)


class Health(_Model):
    status: str = Field(
        default="ok",
        description="ok, or degraded (HTTP 503) when the database or the blob store does not "
        "answer.",
    )
    version: str
    role: str = Field(default="all", description="OSMOSIS_ROLE of the process answering.")
    low_disk: bool = Field(
        default=False, description="The home's disk is below OSMOSIS_MIN_FREE_DISK_BYTES."
    )
    disk: DiskPublic | None = None
    database: ComponentHealth | None = None
    blob_store: ComponentHealth | None = None


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
    deactivated_at: datetime | None = Field(
        default=None, description="Set while the user is deactivated: no token of theirs works."
    )


class UserDeactivated(_Model):
    """`POST /api/admin/users/{user}/deactivate`: the user, and what the change ended."""

    user: UserPublic
    sessions_ended: int
    workspaces_without_owner: list[str] = Field(
        description="Workspaces this user owned that now have no active owner."
    )


# Seconds, or "never"; omitted: the server's OSMOSIS_TOKEN_TTL_DAYS.
TokenLifetime = Annotated[int, Field(gt=0, le=100 * 365 * 86400)] | Literal["never"]


class TokenCreate(_Strict):
    name: Name = "default"
    expires_in: TokenLifetime | None = Field(
        default=None,
        description="Seconds until the token expires, or 'never'; default: the server's "
        "OSMOSIS_TOKEN_TTL_DAYS. A token never outlives the token that creates it for itself.",
    )


class TokenPublic(_Model):
    """A token's metadata; never its secret."""

    id: str
    name: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None
    expires_at: datetime | None = None


class TokenList(_Model):
    """A user's tokens (metadata only), oldest first."""

    tokens: list[TokenPublic]


class TokenCreated(_Model):
    """A new token, with its secret: returned exactly once."""

    id: str
    user_id: str
    name: str
    created_at: datetime
    expires_at: datetime | None = None
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


MemberRole = Literal["owner", "member"]


class WorkspaceMemberPublic(_Model):
    user_id: str
    name: str
    email: str | None
    role: str
    added_at: datetime
    active: bool = True


class BudgetLimits(_Model):
    """A run's budget limits (`[evaluation]`); null: none of that kind."""

    max_tokens_total: int | None = None
    max_cost_usd: float | None = None
    max_model_calls: int | None = None


class WorkspaceBudget(_Model):
    """A platform run's budget is its config's limit, else `defaults`, else
    `platform_ceilings`; clamped to the lower of `ceilings` and `platform_ceilings`."""

    defaults: BudgetLimits
    ceilings: BudgetLimits
    platform_ceilings: BudgetLimits = Field(description="OSMOSIS_BUDGET_MAX_*, every workspace.")


class WorkspacePublic(_Model):
    """A workspace the caller belongs to, with its members."""

    id: str
    identity: str
    created_at: datetime
    created_by: str | None
    role: str | None = Field(
        description="The caller's role; null for an admin who is not a member."
    )
    members: list[WorkspaceMemberPublic]
    sandbox_network: Literal["bridge", "full"] | None = Field(
        default=None,
        description="What this workspace's sandboxed rollouts may reach beyond the model "
        "bridge; null: the platform's OSMOSIS_SANDBOX_NETWORK.",
    )
    budget: WorkspaceBudget | None = Field(
        default=None, description="The workspace's budget defaults and ceilings."
    )


class WorkspaceBudgetUpdate(_Strict):
    """`PATCH /api/workspace/budget`: limits by name (max_tokens_total, max_cost_usd,
    max_model_calls), each a positive number or null to unset it; a name absent stays.
    `defaults`: owners or admins; `ceilings`: admins only. Values are checked by the server
    (400 `INVALID_BUDGET` naming the field)."""

    defaults: dict[str, Any] = Field(default_factory=dict, max_length=8)
    ceilings: dict[str, Any] = Field(default_factory=dict, max_length=8)


class WorkspaceUpdate(_Strict):
    """`PATCH /api/workspace` (admins only): `sandbox_network` bridge | full, or null for the
    platform's default (also when absent)."""

    sandbox_network: Literal["bridge", "full"] | None = None


class WorkspaceCreate(_Strict):
    """`POST /api/workspaces`: a workspace for a git origin's identity (or URL)."""

    identity: str = Field(min_length=1, max_length=4096, examples=["acme/evals"])
    owner: str | None = Field(
        default=None,
        max_length=320,
        description="Admins only: the owning user's id, name or email (default: the caller).",
    )


class WorkspaceSummary(_Model):
    id: str
    identity: str
    role: str
    created_at: datetime
    members: int


class WorkspaceList(_Model):
    """The caller's workspaces, by identity."""

    workspaces: list[WorkspaceSummary]


class MemberUpdate(_Strict):
    role: MemberRole


class MemberAdd(_Strict):
    """Add an existing user by id or email (exactly one); owners (and admins) only."""

    user_id: str | None = Field(default=None, max_length=32)
    email: Email | None = None
    role: MemberRole = "member"

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
