"""The migrations, on an empty SQLite and an empty PostgreSQL database: every revision up and
down again, the schema at head equal to the models, and the data migration of 0006."""

from __future__ import annotations

from datetime import UTC, datetime

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, inspect, text

from osmosis.platform.core.db import Base, make_engine
from osmosis.platform.core.db.migrate import (
    current_revision,
    downgrade,
    head_revision,
    heads,
    revisions,
    upgrade,
)
from tests.platform.databases import Databases


def _differences(engine: Engine) -> list[object]:
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        return list(compare_metadata(context, Base.metadata))


def _tables(engine: Engine) -> set[str]:
    return set(inspect(engine).get_table_names()) - {"alembic_version"}


def test_the_migrations_are_one_line_of_history():
    # Two helpers adding a revision on the same parent make two heads: `upgrade` then fails.
    assert heads() == [head_revision()], f"several heads {heads()}: chain or merge them"
    assert revisions()[0] == "0001" and revisions()[-1] == head_revision()


def test_an_empty_database_upgrades_to_head_and_matches_the_models(databases: Databases):
    engine = make_engine(databases.new_url(migrated=False))
    try:
        assert current_revision(engine) is None
        upgrade(engine)
        assert current_revision(engine) == head_revision()
        assert _differences(engine) == []
        assert _tables(engine) == set(Base.metadata.tables)
        upgrade(engine)  # a second start finds nothing to do
        assert current_revision(engine) == head_revision()
    finally:
        engine.dispose()


def test_every_revision_goes_down_and_up_again(databases: Databases):
    steps = revisions()
    engine = make_engine(databases.new_url(migrated=False))
    try:
        tables_at: dict[str, set[str]] = {}
        for revision in steps:
            upgrade(engine, revision)
            tables_at[revision] = _tables(engine)
        for below, revision in reversed(list(zip(["base", *steps], steps, strict=False))):
            downgrade(engine, below)
            assert current_revision(engine) == (None if below == "base" else below), revision
            assert _tables(engine) == tables_at.get(below, set()), f"down from {revision}"
        upgrade(engine)
        assert _differences(engine) == []
    finally:
        engine.dispose()


def test_0006_quarantines_a_duplicate_identity_on_both_databases(databases: Databases, caplog):
    engine = make_engine(databases.new_url(migrated=False))
    jan = [datetime(2026, 1, day, tzinfo=UTC) for day in (1, 2, 3)]
    try:
        upgrade(engine, "0005")
        with engine.begin() as db:
            # Bound values, not SQL literals: booleans and timestamps differ per dialect.
            db.execute(
                text("INSERT INTO users (id, name, is_admin, created_at) VALUES (:i, :i, :a, :t)"),
                [{"i": "alice", "a": False, "t": jan[0]}, {"i": "bea", "a": False, "t": jan[0]}],
            )
            db.execute(
                text(
                    "INSERT INTO workspaces (id, identity, created_by, created_at) "
                    "VALUES (:i, :w, :c, :t)"
                ),
                [
                    {"i": "w-squat", "w": "Alice/Repo.git", "c": "bea", "t": jan[0]},
                    {"i": "w-alice", "w": "alice/repo", "c": "alice", "t": jan[1]},
                    {"i": "w-upper", "w": "GIT.example.com/team/x/", "c": "alice", "t": jan[2]},
                ],
            )
        with caplog.at_level("WARNING", logger="osmosis.platform"):
            upgrade(engine)
        with engine.connect() as db:
            after = dict(db.execute(text("SELECT id, identity FROM workspaces")).all())
        assert after == {
            "w-alice": "alice/repo",
            "w-squat": "quarantined:w-squat:Alice/Repo.git",
            "w-upper": "git.example.com/team/x",
        }, after
        assert "nothing was merged" in caplog.text
    finally:
        engine.dispose()
