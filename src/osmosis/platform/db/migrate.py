"""Apply the Alembic migrations shipped inside the package, with no alembic.ini anywhere.

upgrade(engine)  # brings the schema to the newest revision
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine

MIGRATIONS_DIR = Path(__file__).with_name("migrations")


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate the database behind `engine` to `revision` (default: the newest)."""
    # Imported here: only server start-up pays for Alembic.
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.begin() as connection:
        # env.py runs on this connection rather than opening its own from a URL.
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at, or None before the first migration."""
    from alembic.migration import MigrationContext

    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()
