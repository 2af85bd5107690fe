"""Store functions for secrets. Values go in encrypted and come out only through
`resolve_secrets`, which the run scheduler calls; no route returns a value.

    set_secret(db, box=box, workspace=ws, user=ada, name="OPENAI_API_KEY", scope=USER,
               value="sk-...")
    resolve_secrets(db, box=box, workspace_id=ws.id, user_id=ada.id, names=["OPENAI_API_KEY"])
    # {'OPENAI_API_KEY': 'sk-...'}   (a personal secret overrides a workspace one)
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

from sqlalchemy import ColumnElement, and_, func, or_, select, text
from sqlalchemy.orm import Session

from osmosis.platform.core.crypto import SecretBox
from osmosis.platform.core.db.dialect import upsert
from osmosis.platform.core.db.models import Secret, User, Workspace, new_id, utcnow
from osmosis.platform.core.errors import NotFound, ValidationFailed
from osmosis.platform.services.workspaces import membership, not_found
from osmosis.wire import SECRET_NAME_MAX, SECRET_NAME_PATTERN

Scope = Literal["user", "workspace"]
USER: Scope = "user"
WORKSPACE: Scope = "workspace"
NAME_PATTERN = re.compile(SECRET_NAME_PATTERN)
MAX_NAME = SECRET_NAME_MAX

# How people say it (the CLI's "personal") and how the wire says it (the reference's "user").
_SCOPES: dict[str, Scope] = {"user": USER, "personal": USER, "workspace": WORKSPACE}


def parse_scope(text: str) -> Scope:
    try:
        return _SCOPES[text]
    except KeyError:
        raise ValidationFailed(
            f"unknown secret scope {text!r}: use personal (or user) or workspace"
        ) from None


def label(scope: str) -> str:
    """The word users see for a stored scope: "personal" or "workspace"."""
    return "personal" if scope == USER else "workspace"


def check_name(name: str) -> str:
    if not (1 <= len(name) <= MAX_NAME) or not NAME_PATTERN.match(name):
        raise ValidationFailed(
            "secret names are 1-255 characters of A-Z, 0-9 and _, starting with a letter",
            details={"name": name[:MAX_NAME], "pattern": NAME_PATTERN.pattern},
        )
    return name


def _context(*, workspace_id: str, scope: str, owner_id: str | None, name: str) -> str:
    return f"{workspace_id}/{scope}/{owner_id or '-'}/{name}"


def _visible(*, workspace_id: str, user_id: str) -> ColumnElement[bool]:
    """The rows a user may see in a workspace: its shared secrets and their own."""
    return and_(
        Secret.workspace_id == workspace_id,
        or_(Secret.scope == WORKSPACE, and_(Secret.scope == USER, Secret.owner_id == user_id)),
    )


def _find(
    db: Session, *, workspace: Workspace, user: User, name: str, scope: Scope
) -> Secret | None:
    owner = Secret.owner_id == user.id if scope == USER else Secret.owner_id.is_(None)
    query = select(Secret).where(
        Secret.workspace_id == workspace.id, Secret.scope == scope, Secret.name == name, owner
    )
    return db.scalar(query)


def set_secret(
    db: Session,
    *,
    box: SecretBox,
    workspace: Workspace,
    user: User,
    name: str,
    scope: Scope,
    value: str,
) -> Secret:
    """Create or replace the secret `name` in `scope` (personal secrets belong to `user`)."""
    check_name(name)
    owner_id = user.id if scope == USER else None
    ciphertext = box.encrypt(
        value,
        context=_context(workspace_id=workspace.id, scope=scope, owner_id=owner_id, name=name),
    )
    now = utcnow()
    # One statement, so two requests setting the same name at once both succeed (the later
    # value stays) instead of one being told to retry: INSERT … ON CONFLICT on the scope's
    # partial unique index, on both databases.
    insert = upsert(db, Secret).values(
        id=new_id(),
        name=name,
        scope=scope,
        workspace_id=workspace.id,
        owner_id=owner_id,
        ciphertext=ciphertext,
        created_at=now,
        updated_at=now,
        updated_by=user.id,
    )
    db.execute(
        insert.on_conflict_do_update(
            index_elements=_UNIQUE_PER_SCOPE[scope],
            index_where=_SCOPE_IS[scope],
            set_={
                "ciphertext": insert.excluded.ciphertext,
                "updated_at": insert.excluded.updated_at,
                "updated_by": insert.excluded.updated_by,
            },
        )
    )
    owner = Secret.owner_id == owner_id if owner_id is not None else Secret.owner_id.is_(None)
    query = select(Secret).where(
        Secret.workspace_id == workspace.id, Secret.scope == scope, Secret.name == name, owner
    )
    return db.scalars(query.execution_options(populate_existing=True)).one()


# The partial unique indexes of models.Secret, as ON CONFLICT names them. The predicate is
# literal SQL: PostgreSQL matches an arbiter index only on a predicate it can prove.
_UNIQUE_PER_SCOPE = {
    WORKSPACE: ["workspace_id", "name"],
    USER: ["workspace_id", "owner_id", "name"],
}
_SCOPE_IS = {WORKSPACE: text("scope = 'workspace'"), USER: text("scope = 'user'")}


def list_secrets(
    db: Session,
    *,
    workspace: Workspace,
    user: User,
    scope: Scope | Literal["all"],
    limit: int | None = None,
    offset: int = 0,
) -> list[Secret]:
    """The secrets `user` may see in `workspace` (metadata only), by name then scope; one
    page of them when `limit` is given."""
    query = select(Secret).where(*_listed(workspace=workspace, user=user, scope=scope))
    query = query.order_by(Secret.name, Secret.scope).offset(offset).limit(limit)
    return list(db.scalars(query))


def count_secrets(
    db: Session, *, workspace: Workspace, user: User, scope: Scope | Literal["all"]
) -> int:
    """How many secrets `list_secrets` would return without a limit."""
    where = _listed(workspace=workspace, user=user, scope=scope)
    return db.scalar(select(func.count()).select_from(Secret).where(*where)) or 0


def _listed(
    *, workspace: Workspace, user: User, scope: Scope | Literal["all"]
) -> list[ColumnElement[bool]]:
    where = [_visible(workspace_id=workspace.id, user_id=user.id)]
    if scope != "all":
        where.append(Secret.scope == scope)
    return where


def delete_secret(
    db: Session, *, workspace: Workspace, user: User, name: str, scope: Scope
) -> Secret:
    """Delete the caller's visible secret `name` in `scope`; returns the deleted row.

    When it is absent but the caller can see one in the other scope, the NotFound says so.
    """
    check_name(name)
    secret = _find(db, workspace=workspace, user=user, name=name, scope=scope)
    if secret is None:
        other: Scope = WORKSPACE if scope == USER else USER
        details: dict[str, str] = {"name": name, "scope": label(scope)}
        message = f"no {label(scope)} secret {name} in this workspace"
        if _find(db, workspace=workspace, user=user, name=name, scope=other) is not None:
            details["exists_in_scope"] = label(other)
            message += f"; a {label(other)} secret of that name exists (--scope {label(other)})"
        raise NotFound(message, details=details)
    db.delete(secret)
    db.flush()
    return secret


class SecretsNotFound(NotFound):
    """Some requested names have no secret the user can see."""


def resolve_secrets(
    db: Session, *, box: SecretBox, workspace_id: str, user_id: str, names: Iterable[str]
) -> dict[str, str]:
    """The values of `names` for `user_id` in `workspace_id`; personal overrides workspace.

    For the run scheduler only. A user outside the workspace resolves nothing (404), and a
    missing name is a `SecretsNotFound` whose message lists them all:
    "Secret(s) not found: A, B".
    """
    wanted = sorted(set(names))
    if membership(db, workspace_id=workspace_id, user_id=user_id) is None:
        raise not_found(workspace_id)
    rows = db.scalars(
        select(Secret).where(
            _visible(workspace_id=workspace_id, user_id=user_id), Secret.name.in_(wanted)
        )
    )
    chosen: dict[str, Secret] = {}
    for row in rows:
        # A personal secret wins over a workspace one of the same name.
        if row.name not in chosen or row.scope == USER:
            chosen[row.name] = row
    missing = [name for name in wanted if name not in chosen]
    if missing:
        raise SecretsNotFound(
            f"Secret(s) not found: {', '.join(missing)}", details={"missing": missing}
        )
    return {
        name: box.decrypt(
            row.ciphertext,
            context=_context(
                workspace_id=row.workspace_id, scope=row.scope, owner_id=row.owner_id, name=name
            ),
        )
        for name, row in chosen.items()
    }


def check_key(db: Session, *, box: SecretBox) -> bool:
    """False when secrets exist that this key cannot decrypt (checked once at start-up)."""
    sample = db.scalar(select(Secret.ciphertext).order_by(Secret.updated_at.desc()).limit(1))
    return sample is None or box.can_decrypt(sample)
