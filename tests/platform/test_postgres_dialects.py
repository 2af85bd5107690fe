"""What differs between SQLite and PostgreSQL, held the same on both (each test runs twice).

NUL characters, timestamps, booleans, rowcount, case, upserts and the races that READ
COMMITTED (PostgreSQL) and late write locks (SQLite) allow in a read-modify-write.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import event, make_url, select, update
from sqlalchemy.orm import Session

from osmosis.platform.core.db import make_engine, make_session_factory
from osmosis.platform.core.db.dataset_models import Dataset, DatasetLog, DatasetVersion
from osmosis.platform.core.db.models import ApiToken, Secret, User, Workspace, WorkspaceMember
from osmosis.platform.core.errors import Conflict
from osmosis.platform.services.secrets import (
    USER,
    WORKSPACE,
    list_secrets,
    resolve_secrets,
    set_secret,
)
from osmosis.platform.services.users import create_user, revoke_token
from osmosis.platform.services.workspaces import (
    OWNER,
    add_member,
    find_member,
    get_or_create,
    set_role,
)
from tests.platform.conftest import LocalPlatform
from tests.platform.databases import Databases

SHA = "0" * 64


def _world(platform: LocalPlatform) -> tuple[User, User, Workspace]:
    with platform.app.state.sessions() as db:
        ada = create_user(db, name="ada", email="ada@example.com", is_admin=False).user
        bob = create_user(db, name="bob", email="bob@example.com", is_admin=False).user
        ws = get_or_create(db, identity="acme/evals", user=ada)
        add_member(db, workspace=ws, user_id=bob.id, role=OWNER)
        db.commit()
        return ada, bob, ws


# -- NUL -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("POST", "/api/admin/users", {"name": "nul", "email": "a\x00b@example.com"}, 422),
        ("POST", "/api/admin/users", {"name": "a\x00b"}, 422),
        ("POST", "/api/auth/tokens", {"name": "laptop\x00"}, 422),
        ("POST", "/api/workspaces", {"identity": "acme/ev\x00als"}, 422),
        ("PUT", "/api/secrets/KEY%00", {"value": "v", "scope": "user"}, 422),
        ("POST", "/api/datasets?file_name=qa%00.jsonl&size=1&sha256=" + SHA, None, 422),
        ("GET", "/api/datasets/qa%00", None, 422),
        ("GET", "/api/eval-runs/run%00name", None, 404),
        ("GET", "/api/eval-runs?status=x%00", None, 200),  # a filter nothing matches
        ("POST", "/api/workspace/members", {"email": "b\x00@example.com"}, 422),
    ],
)
async def test_a_nul_in_a_request_is_refused_with_the_rule_never_a_server_error(
    api, method, path, body, status
):
    # PostgreSQL cannot store NUL in text: each of these was a 500 there before.
    created = await api.post("/api/workspaces", json={"identity": "acme/evals"})
    assert created.status_code == 201, created.text
    headers = {"X-Osmosis-Git": "acme/evals"}
    response = await api.request(method, path, json=body, headers=headers)
    assert response.status_code == status, response.text
    assert status == 200 or set(response.json()) == {"error"}


def test_free_text_with_nul_is_stored_with_the_replacement_character(local_platform):
    ada, _, ws = _world(local_platform)
    sessions = local_platform.app.state.sessions
    with sessions() as db:
        dataset = Dataset(workspace_id=ws.id, name="qa", created_by=ada.id)
        db.add(dataset)
        db.flush()
        version = DatasetVersion(
            dataset_id=dataset.id,
            version=1,
            status="error",
            file_name="qa.jsonl",
            format="jsonl",
            size_bytes=1,
            sha256=SHA,
            error="row 3: bad byte \x00 here",
        )
        db.add(version)
        db.flush()
        for message in ("a\x00b", "\x00"):  # two rows: one batched INSERT
            db.add(DatasetLog(version_id=version.id, level="error", step="check", message=message))
        db.commit()
        version_id = version.id
    with sessions() as db:
        stored = db.scalars(select(DatasetLog.message).where(DatasetLog.version_id == version_id))
        assert sorted(stored) == ["a\ufffdb", "\ufffd"]
        assert db.scalar(select(DatasetVersion.error)) == "row 3: bad byte \ufffd here"
        # A lookup holding NUL finds what was stored for it, on both databases alike.
        found = db.scalar(select(DatasetLog.id).where(DatasetLog.message == "a\x00b"))
        assert found is not None


# -- timestamps, booleans, rowcount, case ----------------------------------------------------
def test_timestamps_come_back_as_the_same_aware_utc_instant_in_any_session_zone(
    databases: Databases, tmp_path
):
    url = databases.new_url()
    if databases.postgresql:
        # A server or session in another zone must not shift what the platform reads.
        zoned = make_url(url).update_query_dict({"options": "-c timezone=Asia/Tokyo"})
        url = zoned.render_as_string(hide_password=False)
    engine = make_engine(url)
    sessions = make_session_factory(engine)
    tokyo = timezone(timedelta(hours=9))
    moment = datetime(2026, 12, 1, 23, 30, 15, 123456, tzinfo=tokyo)
    try:
        with sessions() as db:
            db.add(User(name="tz", email=None, is_admin=True, created_at=moment))
            db.add(User(name="later", email=None, is_admin=False, created_at=moment + timedelta(1)))
            db.commit()
        with sessions() as db:
            got = db.scalar(select(User.created_at).where(User.name == "tz"))
            assert got == moment and got.tzinfo == UTC
            assert got.hour == 14  # 23:30 in Tokyo is 14:30 UTC
            # Comparisons happen in the database, on instants, whatever zone was given.
            newer = db.scalars(select(User.name).where(User.created_at > moment.astimezone(UTC)))
            assert list(newer) == ["later"]
            with pytest.raises(Exception, match="naive datetimes are ambiguous"):
                db.add(User(name="naive", email=None, is_admin=False, created_at=datetime.now()))
                db.flush()
    finally:
        engine.dispose()


def test_booleans_filter_and_come_back_as_bools(local_platform):
    _world(local_platform)
    with local_platform.app.state.sessions() as db:
        rows = db.execute(select(User.name, User.is_admin).order_by(User.name)).all()
        assert [(name, flag) for name, flag in rows] == [
            ("ada", False),
            ("admin", True),
            ("bob", False),
        ]
        assert all(type(flag) is bool for _, flag in rows)
        assert db.scalars(select(User.name).where(User.is_admin.is_(True))).all() == ["admin"]


def test_rowcount_counts_the_rows_matched_even_when_nothing_changes(local_platform):
    # The claim of a run and "sessions ended" read rowcount; both databases count matches.
    _world(local_platform)
    with local_platform.app.state.sessions() as db:
        same = db.execute(update(User).where(User.is_admin.is_(False)).values(is_admin=False))
        none = db.execute(update(User).where(User.name == "nobody").values(is_admin=True))
        assert (same.rowcount, none.rowcount) == (2, 0)  # type: ignore[attr-defined]
        db.rollback()


def test_names_are_case_sensitive_in_equality_and_uniqueness(local_platform):
    ada, _, ws = _world(local_platform)
    with local_platform.app.state.sessions() as db:
        db.add(Dataset(workspace_id=ws.id, name="qa", created_by=ada.id))
        db.add(Dataset(workspace_id=ws.id, name="QA", created_by=ada.id))  # the store refuses
        db.flush()  # ...but the table alone holds both: the rule lives in datasets.py
        assert db.scalars(select(Dataset.name).where(Dataset.name == "Qa")).all() == []
        assert db.scalars(select(Dataset.name).where(Dataset.name == "QA")).all() == ["QA"]
        db.rollback()


# -- races -----------------------------------------------------------------------------------
def _race(
    sessions: Callable[[], Session],
    first: Callable[[Session], Any],
    second: Callable[[Session], Any],
    *,
    hold_sec: float = 1.5,
) -> tuple[Any, Any]:
    """Run `first` up to its commit and hold it there while `second` runs whole.

    The hold ends when `second` is done or after `hold_sec`: a store that locks what it
    reads makes `second` wait for `first`'s commit (the hold times out), one that does not
    lets `second` decide on what `first` has not committed yet. Returns each one's result
    or the exception it raised.
    """
    reached, done = threading.Event(), threading.Event()
    results: dict[str, Any] = {}

    def run(label: str, step: Callable[[Session], Any], hold: bool) -> None:
        with sessions() as db:
            if hold:

                def pause(_session: Session) -> None:
                    reached.set()
                    done.wait(hold_sec)

                event.listen(db, "before_commit", pause, once=True)
            try:
                results[label] = step(db)
                db.commit()
            except Exception as error:  # the outcome under test
                db.rollback()
                results[label] = error
            finally:
                reached.set()

    one = threading.Thread(target=run, args=("first", first, True))
    one.start()
    assert reached.wait(30)
    two = threading.Thread(target=run, args=("second", second, False))
    two.start()
    two.join(60)
    done.set()
    one.join(60)
    assert not one.is_alive() and not two.is_alive()
    return results["first"], results["second"]


def test_two_uploads_differing_only_in_case_never_both_make_a_dataset(local_platform):
    from osmosis.platform.services.datasets import start_upload

    ada, _, ws = _world(local_platform)

    def upload(file_name: str) -> Callable[[Session], Any]:
        def step(db: Session) -> Any:
            user = db.get(User, ada.id)
            workspace = db.get(Workspace, ws.id)
            assert user is not None and workspace is not None
            return start_upload(
                db,
                workspace=workspace,
                user=user,
                file_name=file_name,
                size=10,
                sha256=SHA,
                overwrite=False,
                max_bytes=100,
            ).dataset_id

        return step

    first, second = _race(local_platform.app.state.sessions, upload("qa.jsonl"), upload("QA.jsonl"))
    assert isinstance(first, str), first
    assert isinstance(second, Conflict) and "differs only in letter case" in str(second)
    with local_platform.app.state.sessions() as db:
        assert db.scalars(select(Dataset.name)).all() == ["qa"]


def test_two_owners_demoting_each_other_at_once_leave_one_owner(local_platform):
    ada, bob, ws = _world(local_platform)

    def demote(user: User) -> Callable[[Session], Any]:
        def step(db: Session) -> Any:
            workspace = db.get(Workspace, ws.id)
            assert workspace is not None
            member = find_member(db, workspace=workspace, ref=user.name)
            return set_role(db, workspace=workspace, member=member, role="member").role

        return step

    first, second = _race(local_platform.app.state.sessions, demote(ada), demote(bob))
    assert first == "member"
    assert isinstance(second, Conflict) and "last active owner" in str(second)
    with local_platform.app.state.sessions() as db:
        owners = db.scalars(select(WorkspaceMember.user_id).where(WorkspaceMember.role == OWNER))
        assert owners.all() == [bob.id]


def test_two_admins_revoking_the_last_two_admin_tokens_at_once_keep_one(local_platform):
    with local_platform.app.state.sessions() as db:
        root = db.scalars(select(ApiToken).join(User).where(User.name == "admin")).one()
        other = create_user(db, name="root2", email=None, is_admin=True).issued.token
        db.commit()
        tokens = [root.id, other.id]

    def revoke(token_id: str) -> Callable[[Session], Any]:
        return lambda db: revoke_token(db, token_id=token_id).revoked_at

    first, second = _race(local_platform.app.state.sessions, revoke(tokens[0]), revoke(tokens[1]))
    assert isinstance(first, datetime), first
    assert isinstance(second, Conflict) and "last live admin token" in str(second)
    with local_platform.app.state.sessions() as db:
        live = db.scalars(select(ApiToken.id).where(ApiToken.revoked_at.is_(None))).all()
        assert live == [tokens[1]]


@pytest.mark.parametrize("scope", [WORKSPACE, USER])
def test_setting_one_secret_twice_at_once_keeps_the_later_value(local_platform, scope):
    ada, _, ws = _world(local_platform)
    box = local_platform.app.state.secret_box

    def put(value: str) -> Callable[[Session], Any]:
        def step(db: Session) -> Any:
            user, workspace = db.get(User, ada.id), db.get(Workspace, ws.id)
            assert user is not None and workspace is not None
            secret = set_secret(
                db, box=box, workspace=workspace, user=user, name="KEY", scope=scope, value=value
            )
            return secret.id

        return step

    first, second = _race(local_platform.app.state.sessions, put("one"), put("two"))
    # An upsert on both databases: neither writer is told to try again, one row remains.
    assert isinstance(first, str) and first == second, (first, second)
    with local_platform.app.state.sessions() as db:
        user, workspace = db.get(User, ada.id), db.get(Workspace, ws.id)
        assert user is not None and workspace is not None
        (secret,) = list_secrets(db, workspace=workspace, user=user, scope=scope)
        assert secret.scope == scope and db.scalars(select(Secret.id)).all() == [first]
        resolved = resolve_secrets(db, box=box, workspace_id=ws.id, user_id=ada.id, names=["KEY"])
        assert resolved == {"KEY": "two"}


# -- URLs ------------------------------------------------------------------------------------
@pytest.mark.databases("postgresql")
@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_a_postgresql_url_without_a_driver_goes_through_psycopg(databases: Databases, scheme):
    # SQLAlchemy reads `postgresql://` as psycopg2, which osmosis-eval[postgres] does not install.
    url = make_url(databases.new_url()).set(drivername=scheme)
    engine = make_engine(url.render_as_string(hide_password=False))
    try:
        assert engine.driver == "psycopg"
        with engine.connect() as connection:
            assert connection.dialect.server_version_info >= (13,)
    finally:
        engine.dispose()
