"""Alembic environment: runs online, on the connection `osmosis.platform.core.db.upgrade` passes."""

from __future__ import annotations

from alembic import context

from osmosis.platform.core.db import (  # noqa: F401  (register tables)
    dataset_models,
    run_models,
    web_models,
)
from osmosis.platform.core.db.models import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through osmosis.platform.core.db.upgrade(engine)")

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    # SQLite cannot ALTER most things in place; batch mode rebuilds the table instead.
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
