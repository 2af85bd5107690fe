"""The two statements that differ between SQLite and PostgreSQL: an upsert, and a row lock.

    db.execute(upsert(db, Secret).values(...).on_conflict_do_update(...))
    lock_rows(db, Workspace, Workspace.id == workspace.id)  # then read, decide, write

Why a row lock: PostgreSQL runs transactions at READ COMMITTED, so two requests that each
count the owners of a workspace and then demote one can both see two owners and leave none.
SQLite serialises writers but not the reads before them (the driver begins a transaction at
the first write), so the same race exists there, only with a smaller window. Locking a parent
row first puts the read-modify-write of concurrent requests one after the other, and every
read after the lock sees what the request before it committed.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, Table, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from osmosis.platform.core.db.models import Base


def upsert(db: Session, model: type[Base]) -> Any:
    """`INSERT` for the session's database, with `on_conflict_do_update/nothing`
    (`INSERT … ON CONFLICT` on both; `index_where=` names a partial unique index)."""
    insert = postgresql.insert if db.get_bind().dialect.name == "postgresql" else sqlite.insert
    return insert(model)


def lock_rows(db: Session, model: type[Base], *where: ColumnElement[bool]) -> None:
    """Hold the rows of `model` matching `where` until the transaction ends.

    PostgreSQL: `SELECT … FOR UPDATE`. SQLite has no row locks: an `UPDATE` that changes
    nothing takes the database's write lock now instead of at the first real write, which
    serialises the same way (other writers wait out `busy_timeout`).
    """
    table: Table = model.__table__  # type: ignore[assignment]
    key = next(iter(table.primary_key.columns))
    if db.get_bind().dialect.name == "postgresql":
        db.execute(select(key).where(*where).with_for_update())
    else:
        db.execute(update(table).where(*where).values({key.name: key}))
