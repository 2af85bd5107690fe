"""Every platform setting in one table: name, environment variable, default and help.

`Settings.from_env()` reads the table once into a frozen object that `create_app` receives;
nothing here runs at import, so tests build as many independent settings as they like.

    settings = Settings.from_env({"OSMOSIS_HOME": "/tmp/p"}, port=9000)
    settings.database_url  # 'sqlite:////tmp/p/platform.db'
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_HOME = Path("~/.osmosis/platform")
DEFAULT_PORT = 8765
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def _flag(text: str) -> bool:
    value = text.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"", "0", "false", "no", "off"}:
        return False
    raise ValueError(f"expected a boolean (1/0, true/false), got {text!r}")


@dataclass(frozen=True)
class Setting:
    """One row of the settings table."""

    name: str
    env: str
    default: Any
    help: str
    parse: Callable[[str], Any] = str


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "home",
        "OSMOSIS_HOME",
        DEFAULT_HOME,
        "Directory holding the SQLite database, blobs, credentials.json, pid and log files.",
        Path,
    ),
    Setting(
        "database_url",
        "OSMOSIS_DATABASE_URL",
        None,
        "SQLAlchemy URL of the database; default: SQLite at <home>/platform.db. "
        "PostgreSQL works: postgresql+psycopg://user:pass@host/db.",
    ),
    Setting("host", "OSMOSIS_HOST", "127.0.0.1", "Interface the server listens on."),
    Setting("port", "OSMOSIS_PORT", DEFAULT_PORT, "TCP port the server listens on.", int),
    Setting(
        "max_upload_bytes",
        "OSMOSIS_MAX_UPLOAD_BYTES",
        5 * 1024**3,
        "Largest accepted upload, in bytes (default 5 GB).",
        int,
    ),
    Setting(
        "allow_insecure_http",
        "OSMOSIS_ALLOW_INSECURE_HTTP",
        False,
        "Allow plain http beyond loopback: listening on a public interface, and CLI calls to "
        "a non-loopback http:// URL. Put a TLS proxy in front instead when you can.",
        _flag,
    ),
    Setting(
        "secret_key",
        "OSMOSIS_SECRET_KEY",
        None,
        "Fernet key that encrypts stored secrets; default: <home>/secret.key, created 0600 on "
        "first start. Keep it stable: secrets stored under one key cannot be read with another.",
    ),
    Setting(
        "max_concurrent_runs",
        "OSMOSIS_MAX_CONCURRENT_RUNS",
        2,
        "Evaluation runs executed at once; further submitted runs wait as pending.",
        int,
    ),
)


class SettingsError(ValueError):
    """A setting's value could not be read; the message names the environment variable."""


@dataclass(frozen=True)
class Settings:
    """The platform's validated configuration, passed down explicitly.

    settings = Settings(home=Path("/srv/osmosis"), port=8000)
    app = create_app(settings)
    """

    home: Path = DEFAULT_HOME
    database_url: str | None = None
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    max_upload_bytes: int = 5 * 1024**3
    allow_insecure_http: bool = False
    secret_key: str | None = dataclasses.field(default=None, repr=False)
    max_concurrent_runs: int = 2

    def __post_init__(self) -> None:
        # Normalise once so every consumer sees an absolute home and a concrete database URL.
        home = Path(self.home).expanduser().resolve()
        object.__setattr__(self, "home", home)
        if not self.database_url:
            object.__setattr__(self, "database_url", f"sqlite:///{home / 'platform.db'}")
        if not 0 < self.port < 65536:
            raise SettingsError(f"port must be between 1 and 65535, got {self.port}")
        if self.max_upload_bytes <= 0:
            raise SettingsError("max_upload_bytes must be positive")
        if self.max_concurrent_runs < 1:
            raise SettingsError("max_concurrent_runs must be at least 1")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read every setting from `env` (default: `os.environ`); `overrides` win, None skipped.

        Settings.from_env({"OSMOSIS_PORT": "9000"}).port  # 9000
        """
        source = os.environ if env is None else env
        values: dict[str, Any] = {}
        for setting in SETTINGS:
            raw = source.get(setting.env)
            if raw is None or raw == "":
                continue
            try:
                values[setting.name] = setting.parse(raw)
            except ValueError as error:
                raise SettingsError(f"{setting.env}: {error}") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    @property
    def url(self) -> str:
        """The base URL local clients use (a wildcard bind is reached through loopback)."""
        host = "127.0.0.1" if self.host in {"0.0.0.0", "", "::"} else self.host
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    @property
    def blob_dir(self) -> Path:
        return self.home / "blobs"

    @property
    def credentials_file(self) -> Path:
        """Where the first start leaves the admin token for the local CLI (mode 0600)."""
        return self.home / "credentials.json"

    @property
    def pid_file(self) -> Path:
        return self.home / "server.pid"

    @property
    def state_file(self) -> Path:
        """What a running server tells `osmosis server status`: pid, url, home."""
        return self.home / "server.json"

    @property
    def log_file(self) -> Path:
        return self.home / "server.log"

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)
