"""Starting an API process beside others on one database: it must not undo their work."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
from sqlalchemy import event, select

from osmosis.platform import Settings
from osmosis.platform.core.db import make_engine, make_session_factory
from osmosis.platform.core.db.dataset_models import Dataset, DatasetVersion
from osmosis.platform.core.db.migrate import upgrade
from osmosis.platform.core.db.models import ApiToken, User, Workspace, utcnow
from osmosis.platform.services.bootstrap import bootstrap
from osmosis.platform.services.datasets import ABANDONED_UPLOAD_S, recover_interrupted
from osmosis.platform.services.tokens import hash_token
from osmosis.platform.worker.processes import mark_stopped, register


def _sessions(settings, *, migrate=True):
    engine = make_engine(settings.database_url)
    if migrate:
        upgrade(engine)
    return engine, make_session_factory(engine)


def _uploading(db, *, touched_ago: float) -> str:
    workspace = Workspace(identity=f"example.com/team/{utcnow().timestamp()}")
    db.add(workspace)
    db.flush()
    dataset = Dataset(workspace_id=workspace.id, name="qa", created_at=utcnow())
    db.add(dataset)
    db.flush()
    when = utcnow() - timedelta(seconds=touched_ago)
    version = DatasetVersion(
        dataset_id=dataset.id,
        version=1,
        status="uploading",
        file_name="qa.jsonl",
        format="jsonl",
        size_bytes=10,
        sha256="0" * 64,
        created_at=when,
        updated_at=when,
    )
    db.add(version)
    db.commit()
    return version.id


def _status(sessions, version_id: str) -> str:
    with sessions() as db:
        return db.scalars(
            select(DatasetVersion.status).where(DatasetVersion.id == version_id)
        ).one()


def test_a_starting_server_spares_uploads_another_live_api_process_may_be_receiving(
    databases, tmp_path
):
    settings = databases.settings(tmp_path / "home")
    engine, sessions = _sessions(settings)
    try:
        with sessions() as db:
            fresh = _uploading(db, touched_ago=5)
            abandoned = _uploading(db, touched_ago=ABANDONED_UPLOAD_S + 60)
            other = register(db, role="api", settings=settings)
            db.commit()
        # Another API process is alive: its upload in progress stays, a forgotten one ends.
        assert recover_interrupted(sessions, settings) == 1
        assert (_status(sessions, fresh), _status(sessions, abandoned)) == ("uploading", "error")
        # Alone on the database (the other stopped): every unfinished upload is a dead one.
        with sessions() as db:
            mark_stopped(db, process_id=other)
            db.commit()
        assert recover_interrupted(sessions, settings) == 1
        assert _status(sessions, fresh) == "error"
    finally:
        engine.dispose()


@pytest.mark.databases("postgresql")  # one SQLite database serves one API process
def test_two_api_processes_starting_on_an_empty_database_make_one_admin(databases, tmp_path):
    url = databases.new_url()
    homes = [tmp_path / "one", tmp_path / "two"]
    both_counted = threading.Barrier(2, timeout=20)
    errors: list[BaseException] = []

    def start(home):
        settings = Settings(home=home, database_url=url)
        engine, sessions = _sessions(settings, migrate=False)  # new_url() migrated it

        @event.listens_for(engine, "after_cursor_execute")
        def counted(conn, cursor, statement, *args):  # the race, made certain: both see 0
            if "count(*)" in statement and "users" in statement:
                both_counted.wait()

        try:
            home.mkdir(parents=True)
            bootstrap(sessions, settings)
        except BaseException as error:
            errors.append(error)
        finally:
            engine.dispose()

    threads = [threading.Thread(target=start, args=(home,)) for home in homes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    engine, sessions = _sessions(Settings(home=tmp_path / "check", database_url=url), migrate=False)
    try:
        with sessions() as db:
            admins = list(db.scalars(select(User)))
            hashes = set(db.scalars(select(ApiToken.token_hash)))
    finally:
        engine.dispose()
    assert [user.name for user in admins] == ["admin"]
    files = [home / "credentials.json" for home in homes if (home / "credentials.json").exists()]
    assert len(files) == 1  # the loser's file would hold a token that never existed
    assert hash_token(json.loads(files[0].read_text())["token"]) in hashes
