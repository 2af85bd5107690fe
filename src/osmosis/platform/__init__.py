"""The osmosis platform server: `create_app(settings)` builds it, `serve(settings)` runs it.

    from osmosis.platform import Settings, create_app
    app = create_app(Settings.from_env())

This is the platform's public face, and all the command line may import of it
(`tests/unit/test_import_graph.py`): settings, serving, the errors a start can end in, and
the operations `osmosis server` and `osmosis eval view` perform on a home from outside
(`operations.py`). Names load lazily, so reading `Settings` does not import FastAPI or
SQLAlchemy, and `osmosis --help` stays fast.

Rooms: `core/` (settings, errors, crypto, database, blobs, middleware), `services/` (store
functions), `worker/` (scheduler, leases, the run worker), `api/` and `web/` (routers, the
dashboard); `app.py` builds the app, `server.py` runs a process in its role.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from osmosis.platform.app import create_app
    from osmosis.platform.core.blobs import BlobStoreError
    from osmosis.platform.core.crypto import SecretKeyError
    from osmosis.platform.core.db.engine import DatabaseUnavailable
    from osmosis.platform.core.home_lock import Holder, HomeInUse, process_alive
    from osmosis.platform.core.schema_revision import SchemaMismatch
    from osmosis.platform.core.settings import Settings, SettingsError
    from osmosis.platform.operations import (
        LocalView,
        copy_store,
        home_disk,
        local_row_texts,
        local_view,
        lock_holder,
        migrate_database,
        platform_status,
        server_pid,
        worker_pid,
        worker_state_pid,
    )
    from osmosis.platform.server import serve

__all__ = [
    "BlobStoreError",
    "DatabaseUnavailable",
    "Holder",
    "HomeInUse",
    "LocalView",
    "SchemaMismatch",
    "SecretKeyError",
    "Settings",
    "SettingsError",
    "copy_store",
    "create_app",
    "home_disk",
    "local_row_texts",
    "local_view",
    "lock_holder",
    "migrate_database",
    "platform_status",
    "process_alive",
    "serve",
    "server_pid",
    "worker_pid",
    "worker_state_pid",
]

_HOMES = {
    "BlobStoreError": "osmosis.platform.core.blobs",
    "DatabaseUnavailable": "osmosis.platform.core.db.engine",
    "Holder": "osmosis.platform.core.home_lock",
    "HomeInUse": "osmosis.platform.core.home_lock",
    "LocalView": "osmosis.platform.operations",
    "SchemaMismatch": "osmosis.platform.core.schema_revision",
    "SecretKeyError": "osmosis.platform.core.crypto",
    "Settings": "osmosis.platform.core.settings",
    "SettingsError": "osmosis.platform.core.settings",
    "copy_store": "osmosis.platform.operations",
    "create_app": "osmosis.platform.app",
    "home_disk": "osmosis.platform.operations",
    "local_row_texts": "osmosis.platform.operations",
    "local_view": "osmosis.platform.operations",
    "lock_holder": "osmosis.platform.operations",
    "migrate_database": "osmosis.platform.operations",
    "platform_status": "osmosis.platform.operations",
    "process_alive": "osmosis.platform.core.home_lock",
    "serve": "osmosis.platform.server",
    "server_pid": "osmosis.platform.operations",
    "worker_pid": "osmosis.platform.operations",
    "worker_state_pid": "osmosis.platform.operations",
}


def __getattr__(name: str) -> Any:
    module = _HOMES.get(name)
    if module is None:
        raise AttributeError(f"module 'osmosis.platform' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
