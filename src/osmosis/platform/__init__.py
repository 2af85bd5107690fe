"""The osmosis platform server: `create_app(settings)` builds it, `serve(settings)` runs it.

    from osmosis.platform import Settings, create_app
    app = create_app(Settings.from_env())

Names load lazily, so reading `Settings` does not import FastAPI or SQLAlchemy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from osmosis.platform.app import create_app
    from osmosis.platform.core.settings import Settings
    from osmosis.platform.server import serve

__all__ = ["Settings", "create_app", "serve"]

_HOMES = {
    "Settings": "osmosis.platform.core.settings",
    "create_app": "osmosis.platform.app",
    "serve": "osmosis.platform.server",
}


def __getattr__(name: str) -> Any:
    module = _HOMES.get(name)
    if module is None:
        raise AttributeError(f"module 'osmosis.platform' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
