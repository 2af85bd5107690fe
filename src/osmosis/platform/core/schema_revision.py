"""Is the database's schema the one this osmosis was written for?

    check_schema(engine, migrate=False)   # SchemaMismatch naming both revisions, and the fix
    problem = schema_problem(engine)      # None, or what `/api/health` and a worker report

Several processes share one database, possibly not all of one version. A process never serves
or runs against a schema newer than it knows (another process was upgraded and migrated: it
would misread or break what that one writes), and only `--role all` (the embedded default,
today's single process) migrates by itself; API and worker processes wait for `osmosis server
migrate`, so a team upgrades its schema once, on purpose.
"""

from __future__ import annotations

from functools import cache

from sqlalchemy import Engine

from osmosis.platform.core.db.migrate import current_revision, head_revision, upgrade


class SchemaMismatch(RuntimeError):
    """The database's schema is not this osmosis's; the message says which way and the fix."""


@cache
def known_revisions() -> frozenset[str]:
    """Every revision this osmosis ships."""
    from alembic.script import ScriptDirectory

    from osmosis.platform.core.db.migrate import _config

    script = ScriptDirectory.from_config(_config())
    return frozenset(revision.revision for revision in script.walk_revisions())


def schema_problem(engine: Engine) -> str | None:
    """None when the database is at this osmosis's newest revision, else what is wrong."""
    found, head = current_revision(engine), head_revision()
    if found == head:
        return None
    if found is not None and found not in known_revisions():
        return (
            f"the database's schema is at revision {found}, newer than this osmosis knows (its "
            f"newest is {head}): another process of the platform runs a newer osmosis; upgrade "
            "osmosis here"
        )
    shown = found or "none (an empty database)"
    return (
        f"the database's schema is at revision {shown} and this osmosis needs {head}: run "
        "`osmosis server migrate` once (with the same OSMOSIS_DATABASE_URL), then start"
    )


def check_schema(engine: Engine, *, migrate: bool) -> tuple[str | None, str]:
    """Refuse a schema this osmosis does not know; with `migrate`, bring an older one to head.
    Returns (the revision found, the revision now)."""
    found = current_revision(engine)
    if found is not None and found not in known_revisions():
        problem = schema_problem(engine)
        assert problem is not None
        raise SchemaMismatch(problem)
    if found != head_revision():
        if not migrate:
            problem = schema_problem(engine)
            assert problem is not None
            raise SchemaMismatch(problem)
        upgrade(engine)
    return found, head_revision()
