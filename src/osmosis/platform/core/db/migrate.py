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


def downgrade(engine: Engine, revision: str) -> None:
    """Migrate the database behind `engine` down to `revision` ("base": no tables left).

    For developers and tests: the server only ever upgrades.
    """
    from alembic import command

    config = _config()
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, revision)


def head_revision() -> str:
    """The newest revision the package ships."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None
    return str(head)


def heads() -> list[str]:
    """Every head of the shipped history (more than one: two revisions share a parent)."""
    from alembic.script import ScriptDirectory

    return sorted(ScriptDirectory.from_config(_config()).get_heads())


def revisions() -> list[str]:
    """The shipped revisions, oldest first."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(_config())
    return [revision.revision for revision in reversed(list(script.walk_revisions()))]


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at, or None before the first migration."""
    from alembic.migration import MigrationContext

    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()
