"""`/api/secrets`: a workspace's shared secrets and the caller's personal ones, by name.

Values are write-only: every response carries metadata (name, scope, times, updater) only.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Query, Request

from osmosis.platform.core.crypto import SecretBox
from osmosis.platform.core.db.models import Secret
from osmosis.platform.deps import CurrentUser, CurrentWorkspace, Db, MemberWorkspace, Offset
from osmosis.platform.services import secrets
from osmosis.vocabulary import MAX_PAGE
from osmosis.wire import SecretCreate, SecretList, SecretPublic, SecretScopeIn

router = APIRouter(prefix="/api/secrets", tags=["secrets"])

NamePath = Annotated[
    str, Path(min_length=1, max_length=255, description="A secret name, e.g. OPENAI_API_KEY.")
]


def _box(request: Request) -> SecretBox:
    box: SecretBox = request.app.state.secret_box
    return box


Box = Annotated[SecretBox, Depends(_box)]


def _public(secret: Secret) -> SecretPublic:
    return SecretPublic(
        name=secret.name,
        scope="user" if secret.scope == secrets.USER else "workspace",
        created_at=secret.created_at,
        updated_at=secret.updated_at,
        updated_by=secret.updater.name if secret.updater else None,
    )


@router.get("")
def list_secrets(
    db: Db,
    user: CurrentUser,
    workspace: CurrentWorkspace,
    scope: Annotated[Literal["all", SecretScopeIn], Query()] = "all",
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = MAX_PAGE,
    offset: Offset = 0,
) -> SecretList:
    """Names and metadata of the workspace's secrets and the caller's personal ones, a page
    at a time."""
    wanted = "all" if scope == "all" else secrets.parse_scope(scope)
    rows = secrets.list_secrets(
        db, workspace=workspace, user=user, scope=wanted, limit=limit, offset=offset
    )
    total = secrets.count_secrets(db, workspace=workspace, user=user, scope=wanted)
    has_more = offset + len(rows) < total
    return SecretList(
        secrets=[_public(row) for row in rows],
        total_count=total,
        has_more=has_more,
        next_offset=offset + len(rows) if has_more else None,
        workspace=workspace.identity,
    )


@router.put("/{name}")
def set_secret(
    name: NamePath,
    body: SecretCreate,
    db: Db,
    box: Box,
    user: CurrentUser,
    workspace: CurrentWorkspace,
) -> SecretPublic:
    """Create or replace a secret; personal secrets are visible to their owner only."""
    secret = secrets.set_secret(
        db,
        box=box,
        workspace=workspace,
        user=user,
        name=name,
        scope=secrets.parse_scope(body.scope),
        value=body.value,
    )
    db.commit()
    return _public(secret)


@router.delete("/{name}")
def delete_secret(
    name: NamePath,
    db: Db,
    user: CurrentUser,
    workspace: MemberWorkspace,
    scope: Annotated[SecretScopeIn, Query()] = "user",
) -> SecretPublic:
    """Delete a secret; a miss names the other scope when the caller has the name there."""
    secret = secrets.delete_secret(
        db, workspace=workspace, user=user, name=name, scope=secrets.parse_scope(scope)
    )
    public = _public(secret)
    db.commit()
    return public
