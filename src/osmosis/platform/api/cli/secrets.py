"""`/api/cli/environment-secrets`: `osmosis secret list|set|delete` of the official CLI.

The same secrets as `/api/secrets`, in the official shapes: the list under
`environment_secrets`, upsert by `POST`, delete by a `DELETE` that carries a JSON body.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request

from osmosis.platform.core.crypto import SecretBox
from osmosis.platform.core.db.models import Secret
from osmosis.platform.deps import CurrentUser, Db, Offset
from osmosis.platform.services import secrets
from osmosis.wire.official import (
    MAX_CLI_PAGE,
    EnvironmentSecretDelete,
    EnvironmentSecretList,
    EnvironmentSecretPublic,
    EnvironmentSecretSet,
)

from .deps import CliMemberWorkspace, CliWorkspace
from .errors import OfficialRoute

router = APIRouter(prefix="/environment-secrets", route_class=OfficialRoute)


def public(secret: Secret) -> EnvironmentSecretPublic:
    # We keep who changed a secret last, not who created it: the updater is the best creator
    # we know, and the two are the same until someone replaces the value.
    updater = secret.updater.name if secret.updater else None
    return EnvironmentSecretPublic(
        id=secret.id,
        name=secret.name,
        scope="user" if secret.scope == secrets.USER else "workspace",
        created_at=secret.created_at.isoformat(),
        updated_at=secret.updated_at.isoformat(),
        creator_name=updater,
        updater_name=updater,
    )


@router.get("")
def list_environment_secrets(
    db: Db,
    user: CurrentUser,
    workspace: CliWorkspace,
    scope: Annotated[Literal["all", "user", "workspace"], Query()] = "all",
    limit: Annotated[int, Query(ge=1, le=MAX_CLI_PAGE)] = MAX_CLI_PAGE,
    offset: Offset = 0,
) -> EnvironmentSecretList:
    """Names and metadata of the workspace's secrets and your personal ones."""
    wanted = "all" if scope == "all" else secrets.parse_scope(scope)
    rows = secrets.list_secrets(
        db, workspace=workspace, user=user, scope=wanted, limit=limit, offset=offset
    )
    total = secrets.count_secrets(db, workspace=workspace, user=user, scope=wanted)
    more = offset + len(rows) < total
    return EnvironmentSecretList(
        environment_secrets=[public(row) for row in rows],
        total_count=total,
        has_more=more,
        next_offset=offset + len(rows) if more else None,
    )


@router.post("")
def set_environment_secret(
    body: EnvironmentSecretSet,
    request: Request,
    db: Db,
    user: CurrentUser,
    workspace: CliWorkspace,
) -> EnvironmentSecretPublic:
    """Create or replace a secret; the value is stored encrypted and never returned."""
    box: SecretBox = request.app.state.secret_box
    secret = secrets.set_secret(
        db,
        box=box,
        workspace=workspace,
        user=user,
        name=body.name,
        scope=secrets.parse_scope(body.scope),
        value=body.value,
    )
    db.commit()
    return public(secret)


@router.delete("")
def delete_environment_secret(
    body: EnvironmentSecretDelete, db: Db, user: CurrentUser, workspace: CliMemberWorkspace
) -> EnvironmentSecretPublic:
    """Delete a secret named in the JSON body."""
    secret = secrets.delete_secret(
        db, workspace=workspace, user=user, name=body.name, scope=secrets.parse_scope(body.scope)
    )
    deleted = public(secret)
    db.commit()
    return deleted
