"""The databases platform tests run on: SQLite in the home, and a real PostgreSQL.

Every platform world takes its database from `Databases`, and the fixtures in conftest.py
parametrise it, so each test that touches the database runs twice: `test_x[sqlite]` and
`test_x[postgresql]`, the same test body.

    def test_x(databases, tmp_path):
        settings = databases.settings(tmp_path / "home")            # for create_app
        env = clean_env(OSMOSIS_HOME=str(home), **databases.env(home))  # for a server process

PostgreSQL is a throwaway cluster the test process starts on first use: `initdb` into a new
temporary directory (run as the `postgres` user when we are root: PostgreSQL refuses root), on
a free loopback port, with durability off (it is thrown away) and no Unix socket; the kernel
stops it when the process that started it dies. Each world gets its own database, copied from
a template migrated once per cluster (`CREATE DATABASE … TEMPLATE`: ~0.1 s, a migration ~1 s).

Environment (read when the tests are collected):
- `OSMOSIS_TEST_DATABASES=sqlite` runs the SQLite half only (a machine without PostgreSQL);
  default `sqlite,postgresql`. CI runs both, and a PostgreSQL that cannot start fails every
  test that needs it, naming why: it never skips.
- `OSMOSIS_TEST_POSTGRES_URL=postgresql://user@host:port/postgres` uses a server you run
  instead of a throwaway cluster (the user needs CREATEDB; test databases are dropped).
"""

from __future__ import annotations

import ctypes
import glob
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from osmosis.platform import Settings
from tests.ports import free_port

KINDS = ("sqlite", "postgresql")
# Per process: test processes sharing one external server must not drop each other's.
TEMPLATE = f"osmosis_template_{os.getpid()}"
_STARTUP_TIMEOUT_SEC = 60


def selected_kinds(env: dict[str, str] | os._Environ[str] = os.environ) -> tuple[str, ...]:
    """The kinds `OSMOSIS_TEST_DATABASES` asks for (default: both), checked."""
    raw = env.get("OSMOSIS_TEST_DATABASES", "") or ",".join(KINDS)
    kinds = tuple(part.strip().lower() for part in raw.split(",") if part.strip())
    unknown = [kind for kind in kinds if kind not in KINDS]
    if unknown or not kinds:
        raise ValueError(
            f"OSMOSIS_TEST_DATABASES={raw!r}: expected a comma-separated subset of "
            f"{', '.join(KINDS)}"
        )
    return kinds


def parametrize_only(metafunc: Any) -> None:
    """`pytest_generate_tests` (tryfirst): a test marked `@pytest.mark.databases("sqlite")`
    is generated for those kinds only (a test of SQLite's files has no PostgreSQL half)."""
    marker = metafunc.definition.get_closest_marker("databases")
    if marker is None or "database_kind" not in metafunc.fixturenames:
        return
    unknown = [kind for kind in marker.args if kind not in KINDS]
    if unknown:
        raise ValueError(f"@pytest.mark.databases: unknown kinds {unknown}; use {KINDS}")
    kinds = [kind for kind in selected_kinds() if kind in marker.args]
    # As a parametrize mark, which pytest lets win over the fixture's own params.
    metafunc.definition.add_marker(
        pytest.mark.parametrize("database_kind", kinds, indirect=True, scope="session")
    )


class PostgresUnavailable(RuntimeError):
    """PostgreSQL could not be started or reached; the message says why and what to do."""


# -- the cluster ------------------------------------------------------------------------------
def _bin_dir() -> Path:
    """Where `initdb`/`postgres` are: on PATH, else Debian's newest /usr/lib/postgresql/N/bin."""
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    if not candidates:
        raise PostgresUnavailable(
            "PostgreSQL's server programs (initdb) are not installed: run "
            "scripts/install-system-deps.sh (Debian package postgresql-15), or set "
            "OSMOSIS_TEST_DATABASES=sqlite to run the SQLite half only"
        )
    return Path(candidates[-1]).parent


_PR_SET_PDEATHSIG = 1


def _dies_with_us() -> Callable[[], None] | None:
    """A `preexec_fn`: the kernel sends the postmaster SIGQUIT (immediate shutdown, which
    also ends its backends) when this process dies, so a killed test run leaves no server."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before fork
    parent = os.getpid()

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGQUIT), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return hook


@dataclass
class PostgresCluster:
    """A PostgreSQL server the tests may create and drop databases on.

    cluster = PostgresCluster.throwaway()
    url = cluster.create_database()   # a fresh database migrated to head
    """

    host: str
    port: int
    user: str
    password: str | None = None
    server_version: str = ""
    root: Path | None = None  # the throwaway cluster's directory, removed by `stop`
    process: subprocess.Popen[bytes] | None = None
    _names: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _template_ready: bool = False

    # -- starting ---------------------------------------------------------------------------
    @classmethod
    def throwaway(cls, *, durable: bool = False) -> PostgresCluster:
        """initdb a new cluster in a temporary directory and start it on a free port.

        Tests run it without durability (fsync off: it is thrown away); `durable=True` keeps
        PostgreSQL's defaults, for a benchmark that compares it with SQLite fairly."""
        bin_dir = _bin_dir()
        as_root = os.geteuid() == 0
        run_as: dict[str, Any] = {}
        if as_root:
            import pwd

            try:
                account = pwd.getpwnam("postgres")
            except KeyError:
                raise PostgresUnavailable(
                    "we are root and there is no `postgres` user to run PostgreSQL as "
                    "(PostgreSQL refuses to run as root); install Debian's postgresql-15, "
                    "which creates it"
                ) from None
            run_as = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
        root = Path(tempfile.mkdtemp(prefix="osmosis-pg-"))
        if as_root:
            os.chown(root, run_as["user"], run_as["group"])
        data = root / "data"
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"}
        initdb = subprocess.run(
            [
                str(bin_dir / "initdb"),
                "--pgdata",
                str(data),
                "--username",
                "osmosis",
                "--auth",
                "trust",  # loopback only, a throwaway cluster: no password to manage
                "--encoding",
                "UTF8",
                "--locale",
                "C",  # every system has it; with UTF8 it orders text by code point, as SQLite
                "--no-sync",
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=root,
            timeout=_STARTUP_TIMEOUT_SEC,
            **run_as,
        )
        if initdb.returncode != 0:
            shutil.rmtree(root, ignore_errors=True)
            raise PostgresUnavailable(f"initdb failed: {initdb.stderr.strip()[-2000:]}")
        for attempt in range(3):  # another process may take the free port before we bind it
            try:
                return cls._start(bin_dir, root, run_as, env, durable=durable)
            except PostgresUnavailable:
                if attempt == 2:
                    shutil.rmtree(root, ignore_errors=True)
                    raise
        raise AssertionError("unreachable")

    @classmethod
    def _start(
        cls,
        bin_dir: Path,
        root: Path,
        run_as: dict[str, Any],
        env: dict[str, str],
        *,
        durable: bool,
    ) -> PostgresCluster:
        data, log = root / "data", root / "server.log"
        port = free_port()
        options = {
            "listen_addresses": "127.0.0.1",
            "port": str(port),
            "unix_socket_directories": "",
            "max_connections": "400",
            "shared_buffers": "64MB",
            "log_min_messages": "warning",
            "timezone": "UTC",
        }
        if not durable:
            # Thrown away at the end: durability buys nothing and costs the suite time.
            options.update(fsync="off", synchronous_commit="off", full_page_writes="off")
        argv = [str(bin_dir / "postgres"), "-D", str(data)]
        for key, value in options.items():
            argv += ["-c", f"{key}={value}"]
        with log.open("ab") as log_file:
            if run_as:
                os.chown(log, run_as["user"], run_as["group"])
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=root,
                preexec_fn=_dies_with_us(),
                **run_as,
            )
        cluster = cls(host="127.0.0.1", port=port, user="osmosis", root=root, process=process)
        try:
            cluster._wait_ready(log)
        except PostgresUnavailable:
            cluster.root = None  # the directory stays for the next attempt
            cluster.stop()
            raise
        return cluster

    @classmethod
    def external(cls, url: str) -> PostgresCluster:
        """A server someone runs, from `OSMOSIS_TEST_POSTGRES_URL`."""
        from sqlalchemy import make_url

        parsed = make_url(url)
        cluster = cls(
            host=parsed.host or "127.0.0.1",
            port=parsed.port or 5432,
            user=parsed.username or "postgres",
            password=parsed.password,
        )
        cluster._wait_ready(None)
        return cluster

    def _wait_ready(self, log: Path | None) -> None:
        import psycopg

        deadline = time.monotonic() + _STARTUP_TIMEOUT_SEC
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                break
            try:
                with self._admin() as admin:
                    row = admin.execute("SHOW server_version").fetchone()
                    self.server_version = str(row[0]) if row else ""
                    return
            except psycopg.OperationalError as error:
                last = error
                time.sleep(0.1)
        told = log.read_text(errors="replace")[-2000:] if log and log.exists() else str(last)
        raise PostgresUnavailable(f"PostgreSQL on {self.host}:{self.port} did not start: {told}")

    # -- databases --------------------------------------------------------------------------
    def _admin(self) -> Any:
        import psycopg

        return psycopg.connect(
            host=self.host,
            port=self.port,
            user=self.user,
            password=self.password,
            dbname="postgres",
            autocommit=True,
            connect_timeout=10,
        )

    def url(self, database: str) -> str:
        """The SQLAlchemy URL of `database` on this server (psycopg v3 driver)."""
        from sqlalchemy import URL

        return URL.create(
            "postgresql+psycopg",
            username=self.user,
            password=self.password,
            host=self.host,
            port=self.port,
            database=database,
        ).render_as_string(hide_password=False)

    def create_database(self, *, migrated: bool = True) -> str:
        """A new database and its URL: a copy of the migrated template, or empty."""
        if migrated:
            self._ensure_template()
        name = f"osmosis_{os.getpid()}_{next(self._names)}"
        template = TEMPLATE if migrated else "template0"
        with self._admin() as admin:
            admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        return self.url(name)

    def drop_database(self, url: str) -> None:
        """Drop the database behind `url`, ending any connection still open to it."""
        from sqlalchemy import make_url

        name = make_url(url).database
        with self._admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def _ensure_template(self) -> None:
        if self._template_ready:
            return
        from osmosis.platform.core.db import make_engine, upgrade

        with self._admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE}" WITH (FORCE)')
            admin.execute(f'CREATE DATABASE "{TEMPLATE}" TEMPLATE template0')
        engine = make_engine(self.url(TEMPLATE))
        try:
            upgrade(engine)
        finally:
            engine.dispose()  # a template must have no connection when it is copied
        self._template_ready = True

    def stop(self) -> None:
        """Stop the throwaway server and remove its directory (an external one is left,
        without the template this process made)."""
        if self.process is None and self._template_ready:
            self.drop_database(self.url(TEMPLATE))
            self._template_ready = False
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGQUIT)  # immediate shutdown: nothing to keep
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None


_shared: PostgresCluster | PostgresUnavailable | None = None


def shared_cluster() -> PostgresCluster:
    """This process's cluster, started on first use (once: a failure is remembered)."""
    global _shared
    if _shared is None:
        try:
            external = os.environ.get("OSMOSIS_TEST_POSTGRES_URL")
            _shared = (
                PostgresCluster.external(external) if external else PostgresCluster.throwaway()
            )
        except PostgresUnavailable as error:
            _shared = error
    if isinstance(_shared, PostgresUnavailable):
        raise _shared
    return _shared


def stop_shared_cluster() -> None:
    global _shared
    if isinstance(_shared, PostgresCluster):
        _shared.stop()
    _shared = None


# -- what a world asks for --------------------------------------------------------------------
@dataclass
class Databases:
    """The databases of one test (or module): a URL per platform home, dropped at the end.

    On SQLite a home keeps its default `<home>/platform.db`; on PostgreSQL each home gets its
    own fresh database, the same one however often it is asked for (a restarted server
    finds its data).
    """

    kind: str
    cluster: PostgresCluster | None = None
    _by_home: dict[Path, str] = field(default_factory=dict)
    _created: list[str] = field(default_factory=list)

    @property
    def postgresql(self) -> bool:
        return self.kind == "postgresql"

    def url(self, home: Path | str) -> str:
        """The database URL of the platform at `home`."""
        key = Path(home).expanduser().resolve()
        if self.cluster is None:
            return f"sqlite:///{key / 'platform.db'}"
        if key not in self._by_home:
            self._by_home[key] = self.new_url()
        return self._by_home[key]

    def new_url(self, *, migrated: bool = True) -> str:
        """A database of its own, not tied to a home (SQLite: a file in a new directory)."""
        if self.cluster is None:
            directory = Path(tempfile.mkdtemp(prefix="osmosis-sqlite-"))
            self._created.append(str(directory))
            url = f"sqlite:///{directory / 'platform.db'}"
            if migrated:
                from osmosis.platform.core.db import make_engine, upgrade

                engine = make_engine(url)
                try:
                    upgrade(engine)
                finally:
                    engine.dispose()
            return url
        url = self.cluster.create_database(migrated=migrated)
        self._created.append(url)
        return url

    def env(self, home: Path | str) -> dict[str, str]:
        """The variables a server process at `home` needs: `OSMOSIS_DATABASE_URL` on
        PostgreSQL, nothing on SQLite (the home's default database)."""
        return {"OSMOSIS_DATABASE_URL": self.url(home)} if self.cluster is not None else {}

    def settings(self, home: Path | str, **fields: Any) -> Settings:
        """`Settings` for an in-process app at `home` on this database."""
        return Settings(home=Path(home), database_url=self.url(home), **fields)

    def stored_bytes(self, url: str) -> bytes:
        """Everything the database at `url` holds, as bytes to search for a value that must
        not be stored: SQLite's files (the WAL too), or every PostgreSQL row as text."""
        from sqlalchemy import inspect, make_url, text

        from osmosis.platform.core.db import make_engine

        if make_url(url).get_backend_name() == "sqlite":
            path = Path(str(make_url(url).database))
            return b"".join(p.read_bytes() for p in sorted(path.parent.glob(path.name + "*")))
        engine = make_engine(url)
        try:
            with engine.connect() as connection:
                tables = inspect(connection).get_table_names()
                rows = [
                    str(row[0]).encode()
                    for table in tables
                    for row in connection.execute(text(f'SELECT t::text FROM "{table}" t'))
                ]
        finally:
            engine.dispose()
        return b"\n".join(rows)

    def size_bytes(self, url: str) -> int:
        """How much disk the database at `url` takes: SQLite's files, PostgreSQL's
        `pg_database_size`."""
        from sqlalchemy import make_url, text

        from osmosis.platform.core.db import make_engine

        if make_url(url).get_backend_name() == "sqlite":
            path = Path(str(make_url(url).database))
            return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
        engine = make_engine(url)
        try:
            with engine.connect() as connection:
                size = connection.execute(text("SELECT pg_database_size(current_database())"))
                return int(size.scalar_one())
        finally:
            engine.dispose()

    def close(self) -> None:
        """Drop every database made here (SQLite: remove the directories `new_url` made)."""
        for created in reversed(self._created):
            if self.cluster is None:
                shutil.rmtree(created, ignore_errors=True)
            else:
                self.cluster.drop_database(created)
        self._created.clear()
        self._by_home.clear()
