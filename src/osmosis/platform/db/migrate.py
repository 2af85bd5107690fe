"""Apply the Alembic migrations shipped inside the package, with no alembic.ini anywhere.

upgrade(engine)  # brings the schema to the newest revision
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine

MIGRATIONS_DIR = Path(__file__).with_name("migrations")


def _config() -> Any:
    # Imported here: only server start-up pays for Alembic.
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate the database behind `engine` to `revision` (default: the newest)."""
    from alembic import command

    config = _config()
    with engine.begin() as connection:
        # env.py runs on this connection rather than opening its own from a URL.
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def head_revision() -> str:
    """The newest revision the package ships."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None
    return str(head)


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at, or None before the first migration."""
    from alembic.migration import MigrationContext

    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()
