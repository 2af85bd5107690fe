"""What the datasets and secrets pages read: the viewer's workspaces, their datasets (newest
version of each, with its stored preview rows) and their secrets' names and scopes.

Everything is scoped to the workspaces the viewer belongs to; a dataset elsewhere is
`NotFound` exactly like one that does not exist.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from osmosis.platform.core.db.dataset_models import Dataset, DatasetVersion
from osmosis.platform.core.db.models import Secret, User, Workspace, WorkspaceMember
from osmosis.platform.core.errors import NotFound
from osmosis.platform.services import secrets


def member_workspaces(db: Session, *, user: User) -> list[Workspace]:
    """The viewer's workspaces by identity."""
    query = (
        select(Workspace)
        .join(WorkspaceMember, WorkspaceMember.workspace_id == Workspace.id)
        .where(WorkspaceMember.user_id == user.id)
        .order_by(Workspace.identity)
    )
    return list(db.scalars(query))


@dataclass(frozen=True)
class DatasetRow:
    dataset: Dataset
    workspace: str
    latest: DatasetVersion
    versions: int


def list_datasets(db: Session, *, user: User) -> list[DatasetRow]:
    """Every dataset of the viewer's workspaces with its newest version, by workspace, name."""
    newest = (
        select(
            DatasetVersion.dataset_id,
            func.max(DatasetVersion.version).label("version"),
            func.count().label("count"),
        )
        .group_by(DatasetVersion.dataset_id)
        .subquery()
    )
    query = (
        select(Dataset, Workspace.identity, DatasetVersion, newest.c.count)
        .join(Workspace, Workspace.id == Dataset.workspace_id)
        .join(WorkspaceMember, WorkspaceMember.workspace_id == Workspace.id)
        .join(newest, newest.c.dataset_id == Dataset.id)
        .join(
            DatasetVersion,
            (DatasetVersion.dataset_id == Dataset.id)
            & (DatasetVersion.version == newest.c.version),
        )
        .where(WorkspaceMember.user_id == user.id)
        .order_by(Workspace.identity, Dataset.name)
    )
    found = db.execute(query)
    return [DatasetRow(dataset=d, workspace=ws, latest=v, versions=n) for d, ws, v, n in found]


@dataclass(frozen=True)
class DatasetPreview:
    dataset: Dataset
    workspace: str
    version: DatasetVersion
    columns: list[str]
    rows: list[dict[str, Any]]


def dataset_preview(db: Session, *, user: User, dataset_id: str) -> DatasetPreview:
    """The newest version of a dataset of the viewer's, with the rows stored for preview."""
    found = db.execute(
        select(Dataset, Workspace.identity)
        .join(Workspace, Workspace.id == Dataset.workspace_id)
        .join(WorkspaceMember, WorkspaceMember.workspace_id == Workspace.id)
        .where(Dataset.id == dataset_id, WorkspaceMember.user_id == user.id)
    ).first()
    if found is None or not found[0].versions:
        raise NotFound("dataset not found among your workspaces", details={"id": dataset_id})
    dataset, workspace = found
    version = dataset.versions[-1]
    rows = [row for row in _json_list(version.preview) if isinstance(row, dict)]
    columns = [str(c) for c in _json_list(version.columns)]
    for row in rows:  # a JSONL row may carry keys the column list does not name
        columns.extend(str(key) for key in row if str(key) not in columns)
    return DatasetPreview(
        dataset=dataset,
        workspace=workspace,
        version=version,
        columns=columns,
        rows=rows,
    )


def _json_list(text: str | None) -> list[Any]:
    if not text:
        return []
    try:
        value = json.loads(text)
    except ValueError:
        return []
    return value if isinstance(value, list) else []


@dataclass(frozen=True)
class SecretRow:
    workspace: str
    name: str
    scope: str
    updated_by: str | None
    updated_at: Any


def list_secret_names(db: Session, *, user: User) -> list[SecretRow]:
    """Names and scopes of every secret the viewer can see; values are never read here."""
    out: list[SecretRow] = []
    for workspace in member_workspaces(db, user=user):
        rows: list[Secret] = secrets.list_secrets(db, workspace=workspace, user=user, scope="all")
        out.extend(
            SecretRow(
                workspace=workspace.identity,
                name=row.name,
                scope=secrets.label(row.scope),
                updated_by=row.updater.name if row.updater else None,
                updated_at=row.updated_at,
            )
            for row in rows
        )
    return out
