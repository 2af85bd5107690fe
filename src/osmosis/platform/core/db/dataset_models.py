"""Dataset tables: a named dataset of a workspace, its immutable versions, and their logs.

A dataset's name is the upload's file stem, unique within its workspace. Every upload makes a
new `DatasetVersion`; an overwrite adds a version rather than changing one, so a run keeps
reading exactly the bytes it was given. The content itself lives in the blob store, keyed by
`sha256`; a version stores only the key and what validation learned about it.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from osmosis.platform.core.db.models import Base, User, UtcDateTime, new_id, utcnow

# uploading: bytes arriving; processing: complete and verified, being validated;
# uploaded: ready for preview, download and runs; error: see the version's logs.
VERSION_STATUSES = ("uploading", "processing", "uploaded", "error")
DATASET_FORMATS = ("csv", "jsonl", "parquet")


class Dataset(Base):
    """A workspace's dataset, named by the stem of the file uploaded for it."""

    __tablename__ = "datasets"
    __table_args__ = (UniqueConstraint("workspace_id", "name", name="uq_datasets_workspace_name"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    workspace_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("workspaces.id", ondelete="CASCADE"), index=True
    )
    name: Mapped[str] = mapped_column(String(255))
    created_by: Mapped[str | None] = mapped_column(
        String(32), ForeignKey("users.id", ondelete="SET NULL")
    )
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)

    versions: Mapped[list[DatasetVersion]] = relationship(
        back_populates="dataset",
        cascade="all, delete-orphan",
        passive_deletes=True,
        order_by="DatasetVersion.version",
    )


class DatasetVersion(Base):
    """One upload of a dataset. Once `uploaded` it never changes."""

    __tablename__ = "dataset_versions"
    __table_args__ = (
        UniqueConstraint("dataset_id", "version", name="uq_dataset_versions_dataset_version"),
        CheckConstraint(
            "status IN ('uploading', 'processing', 'uploaded', 'error')", name="status"
        ),
        CheckConstraint("format IN ('csv', 'jsonl', 'parquet')", name="format"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    dataset_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("datasets.id", ondelete="CASCADE"), index=True
    )
    version: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), index=True)
    file_name: Mapped[str] = mapped_column(String(300))
    format: Mapped[str] = mapped_column(String(16))
    size_bytes: Mapped[int] = mapped_column(BigInteger)  # declared by the client, then verified
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    rows: Mapped[int | None] = mapped_column(Integer)
    columns: Mapped[str | None] = mapped_column(Text)  # JSON list of column names
    mode: Mapped[str | None] = mapped_column(String(16))  # "prompt" | "metadata"
    preview: Mapped[str | None] = mapped_column(Text)  # JSON list of the first rows
    error: Mapped[str | None] = mapped_column(Text)
    created_by: Mapped[str | None] = mapped_column(
        String(32), ForeignKey("users.id", ondelete="SET NULL")
    )
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)

    dataset: Mapped[Dataset] = relationship(back_populates="versions")
    creator: Mapped[User | None] = relationship(foreign_keys=[created_by])


class DatasetLog(Base):
    """A processing log line of a version (`dataset logs`).

    The id is a counter, unlike other tables: it orders lines oldest first and doubles as the
    paging cursor, which timestamps alone cannot (two lines may share one).
    """

    __tablename__ = "dataset_logs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    version_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("dataset_versions.id", ondelete="CASCADE"), index=True
    )
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    level: Mapped[str] = mapped_column(String(16))
    step: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text)
