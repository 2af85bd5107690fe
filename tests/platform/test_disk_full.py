"""Issue 25.5: a full disk is survivable. With the platform's disk full, reads and auth answer
200, a write answers 507 `DISK_FULL` in the error envelope (never 500), and once space is
freed the same write works, with no restart.

The end-to-end tests put a real server's home (or its database) on a small tmpfs that they
fill: the tests run as root, as CI does."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import httpx
import psycopg.errors
import pytest
import sqlalchemy.exc
from sqlalchemy import event, text
from sqlalchemy.orm import Session

from osmosis.platform.core.db.models import ApiToken, utcnow
from osmosis.platform.core.db.run_models import EvalRun
from osmosis.platform.core.disk import disk_full_reason
from osmosis.platform.core.settings import Settings
from osmosis.platform.services.token_use import LAST_USED_PRECISION, TokenUses
from osmosis.platform.worker.leases import why_pending
from tests.platform.conftest import clean_env, free_port, osmosis
from tests.platform.test_hardening_ops import fill, small_disk

MB = 1024 * 1024
GIT = {"X-Osmosis-Git": "example-org/ws"}


def dataset(tag: str) -> bytes:
    rows = [{"user_prompt": f"{tag} question {i}", "ground_truth": str(i)} for i in range(4)]
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


# -- a real server on a small disk -------------------------------------------------------------
@dataclass
class DiskServer:
    url: str
    home: Path
    env: dict[str, str]

    @property
    def admin_token(self) -> str:
        return str(json.loads((self.home / "credentials.json").read_text())["token"])

    def call(self, method: str, path: str, token: str, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}", **GIT}
        return httpx.request(method, f"{self.url}{path}", headers=headers, timeout=30, **kwargs)

    def upload(self, token: str, name: str, data: bytes) -> httpx.Response:
        params = {
            "file_name": f"{name}.jsonl",
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
        return self.call("POST", "/api/datasets", token, params=params, content=data)

    def log(self) -> str:
        return (self.home / "server.log").read_text(errors="replace")


@pytest.fixture
def server_on(tmp_path: Path) -> Iterator[Any]:
    """`server_on(home, **settings)`: a server with its home at `home`, stopped at the end."""
    started: list[DiskServer] = []

    def start(home: Path, **settings: str) -> DiskServer:
        env = clean_env(
            OSMOSIS_HOME=str(home), OSMOSIS_CONFIG_DIR=str(tmp_path / "config"), **settings
        )
        port = free_port()
        result = osmosis("server", "start", "--detach", "--port", str(port), env=env)
        assert result.returncode == 0, result.stderr + result.stdout
        server = DiskServer(url=f"http://127.0.0.1:{port}", home=home, env=env)
        started.append(server)
        # Kept now: a test's small disk is unmounted before this fixture's teardown, and
        # with it the server.pid that `server stop` reads.
        pids.append(int((home / "server.pid").read_text().split()[0]))
        return server

    pids: list[int] = []
    yield start
    for server in started:
        osmosis("server", "stop", env=server.env)
    for pid in pids:
        _end(pid)


def _end(pid: int) -> None:
    """SIGTERM, then SIGKILL after 10 s, a server `server stop` could not reach."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            os.kill(pid, 0)
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)


def new_member(server: DiskServer, name: str) -> str:
    """A new user's token; they are a member of the workspace (the admin creates it)."""
    admin = server.admin_token
    answer = server.call("POST", "/api/admin/users", admin, json={"name": name})
    assert answer.status_code == 201, answer.text
    assert server.call("GET", "/api/workspace", admin).status_code == 200  # created
    user_id = answer.json()["user"]["id"]
    added = server.call("POST", "/api/workspace/members", admin, json={"user_id": user_id})
    assert added.status_code == 201, added.text
    return str(answer.json()["token"]["token"])


def assert_disk_full(answer: httpx.Response) -> None:
    assert answer.status_code == 507, answer.text
    error = answer.json()["error"]
    assert error["code"] == "DISK_FULL"
    assert "the platform's disk is full" in error["message"]
    assert "free space" in error["message"] and error["details"]["reason"]


@pytest.mark.slow  # up to 10 s for the background flush of token uses
def test_a_full_home_keeps_reads_and_auth_and_refuses_writes_until_space_is_freed(
    tmp_path, server_on
):
    with small_disk(tmp_path / "disk", 48) as disk:
        server = server_on(disk / "home")
        bo = new_member(server, "bo")
        assert server.upload(bo, "before", dataset("before")).status_code == 201
        # A token never used yet: checking it used to write its `last_used_at` at once.
        made = server.call("POST", "/api/auth/tokens", bo, json={"name": "fresh"})
        assert made.status_code == 201, made.text
        fresh = made.json()["token"]

        filler = fill(disk, leave=0)
        for token in (fresh, bo, server.admin_token):
            for path in ("/api/auth/whoami", "/api/datasets", "/api/eval-runs"):
                answer = server.call("GET", path, token)
                assert answer.status_code == 200, (path, answer.text)
        whoami = server.call("GET", "/api/auth/whoami", fresh).json()
        assert whoami["token"]["last_used_at"] is not None  # counted, though not yet written
        listed = server.call("GET", "/api/datasets", bo).json()["datasets"]
        assert [d["name"] for d in listed] == ["before"]

        refused = server.upload(bo, "after", dataset("after"))
        assert_disk_full(refused)
        assert "free on the disk of the blob store" in refused.json()["error"]["message"]

        filler.unlink()  # space is back: the same upload works, no restart
        answer = server.upload(bo, "after", dataset("after"))
        assert answer.status_code == 201, answer.text
        names = [d["name"] for d in server.call("GET", "/api/datasets", bo).json()["datasets"]]
        assert names == ["after", "before"]
        assert server.call("GET", "/api/auth/whoami", fresh).status_code == 200
        # The fresh token's use, not written while the disk was full, is written by the
        # server's background flush once it can be (every 10 s).
        deadline = time.monotonic() + 30
        while stored_last_use(disk / "home", made.json()["id"]) is None:
            assert time.monotonic() < deadline, "the token's last use was never written"
            time.sleep(0.2)


def stored_last_use(home: Path, token_id: str) -> str | None:
    with sqlite3.connect(home / "platform.db") as connection:
        row = connection.execute(
            "SELECT last_used_at FROM api_tokens WHERE id = ?", (token_id,)
        ).fetchone()
    return None if row is None else row[0]


def test_a_full_database_answers_507_for_writes_and_200_for_reads(tmp_path, server_on):
    # The home has room; the database's own disk is filled to the brim, so whatever write
    # needs a new page is refused by SQLite ("database or disk is full").
    with small_disk(tmp_path / "db_disk", 16) as db_disk:
        server = server_on(
            tmp_path / "home", OSMOSIS_DATABASE_URL=f"sqlite:///{db_disk / 'platform.db'}"
        )
        bo = new_member(server, "bo")
        filler = fill(db_disk, leave=0)

        statuses = []
        for number in range(300):  # until the database cannot grow any more
            answer = server.call("POST", "/api/auth/tokens", bo, json={"name": f"t{number}"})
            statuses.append(answer.status_code)
            assert answer.status_code in (201, 507), answer.text
            if answer.status_code == 507:
                assert_disk_full(answer)
                assert "database or disk is full" in answer.json()["error"]["details"]["reason"]
                break
        assert statuses[-1] == 507, f"the database never filled: {len(statuses)} tokens"
        for path in ("/api/auth/whoami", "/api/auth/tokens", "/api/datasets"):
            assert server.call("GET", path, bo).status_code == 200, path
        assert "unhandled error" not in server.log()

        filler.unlink()
        answer = server.call("POST", "/api/auth/tokens", bo, json={"name": "after"})
        assert answer.status_code == 201, answer.text


# -- in process ---------------------------------------------------------------------------------
def _cap_database(platform: Any) -> None:
    """Let the SQLite database grow no more: the next write that needs a page is SQLITE_FULL."""
    engine = platform.app.state.engine
    with engine.connect() as connection:
        pages = int(connection.execute(text("PRAGMA page_count")).scalar_one())
    engine.dispose()

    @event.listens_for(engine, "connect")
    def cap(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.execute(f"PRAGMA max_page_count = {pages}")


@pytest.mark.databases("sqlite")
async def test_a_database_that_cannot_grow_is_a_507_not_a_500(local_platform, api):
    _cap_database(local_platform)
    assert (await api.get("/api/auth/whoami")).status_code == 200  # auth writes nothing
    statuses = []
    for number in range(300):
        answer = await api.post("/api/auth/tokens", json={"name": f"t{number}"})
        statuses.append(answer.status_code)
        if answer.status_code != 201:
            break
    assert statuses[-1] == 507, statuses[-3:]
    assert answer.json()["error"]["code"] == "DISK_FULL"
    assert (await api.get("/api/auth/tokens")).status_code == 200


def _sqlite_full() -> sqlite3.OperationalError:
    connection = sqlite3.connect(":memory:")
    connection.execute("CREATE TABLE t (x)")
    connection.execute("PRAGMA max_page_count = 2")
    try:
        for _ in range(100):
            connection.execute("INSERT INTO t VALUES (?)", ("x" * 1000,))
    except sqlite3.OperationalError as error:
        return error
    raise AssertionError("SQLite never filled")


def _wrapped(error: Exception) -> Exception:
    """As SQLAlchemy raises a driver's error, and as our code re-raises it."""
    wrapped = sqlalchemy.exc.OperationalError("INSERT ...", {}, error)
    try:
        try:
            raise wrapped
        except Exception as inner:
            raise RuntimeError("while saving") from inner
    except RuntimeError as outer:
        return outer


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), "No space left on device"),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), "Disk quota exceeded"),
        (_sqlite_full(), "database or disk is full"),
        (_wrapped(_sqlite_full()), "database or disk is full"),
        (psycopg.errors.DiskFull("could not extend file"), "could not extend file"),
        (_wrapped(psycopg.errors.DiskFull("could not extend file")), "could not extend file"),
        (OSError(errno.EACCES, "Permission denied"), None),
        (sqlite3.OperationalError("database is locked"), None),
        (ValueError("no"), None),
    ],
)
def test_disk_full_reason_names_what_refused_the_write(error, reason):
    assert disk_full_reason(error) == reason


# -- token uses -------------------------------------------------------------------------------
def test_token_uses_are_kept_in_memory_and_written_in_one_batch(local_platform):
    sessions = local_platform.app.state.sessions
    with sessions() as db:
        token = db.query(ApiToken).one()
        assert token.last_used_at is None
    uses = TokenUses()
    uses.record(token)
    seen = uses.last_used(token)
    assert seen is not None and len(uses) == 1

    def refused() -> Session:
        raise sqlalchemy.exc.OperationalError("UPDATE", {}, _sqlite_full())

    with pytest.raises(sqlalchemy.exc.OperationalError):
        uses.flush(cast(Any, refused))
    assert len(uses) == 1 and uses.last_used(token) == seen  # kept for the next flush

    assert uses.flush(sessions) == 1 and len(uses) == 0
    with sessions() as db:
        stored = db.get(ApiToken, token.id)
        assert stored is not None and stored.last_used_at == seen
        uses.record(stored, now=seen + LAST_USED_PRECISION / 2)  # within the precision
        assert len(uses) == 0
        uses.record(stored, now=utcnow() + timedelta(minutes=5))
        assert len(uses) == 1


async def test_checking_a_token_writes_nothing(local_platform, api):
    statements: list[str] = []
    engine = local_platform.app.state.engine
    event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    assert (await api.get("/api/auth/whoami")).status_code == 200
    assert (await api.get("/api/datasets", headers=GIT)).status_code == 200
    writes = [s for s in statements if s.lstrip().upper().startswith(("UPDATE", "INSERT"))]
    assert not [s for s in writes if "api_tokens" in s], writes
    tokens = (await api.get("/api/auth/tokens")).json()["tokens"]
    assert tokens[0]["last_used_at"] is not None  # the use counts before it is written


# -- runs wait for disk space -------------------------------------------------------------------
def test_a_pending_run_says_it_waits_for_disk_space(tmp_path):
    settings = Settings(home=tmp_path / "home", min_free_disk_bytes=2**62)
    run = EvalRun(status="pending", stop_requested=False)
    reason = why_pending(cast(Session, None), run=run, settings=settings)
    assert reason is not None and reason.startswith("waiting for disk space: the disk holding")
    assert "OSMOSIS_MIN_FREE_DISK_BYTES" in reason and "once space is freed" in reason
