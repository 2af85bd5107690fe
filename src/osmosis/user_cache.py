"""Where osmosis keeps what it can make again: `${XDG_CACHE_HOME:-~/.cache}/osmosis`.

Standard library only: the CLI, the engine and a Ray node's actor each use it.

    user_cache_dir() / "envs"                 # rollout venvs on a Ray node
    user_cache_dir(options.environ) / "datasets"
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def user_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """`$XDG_CACHE_HOME/osmosis`, or `~/.cache/osmosis` when it is unset or empty."""
    base = (os.environ if environ is None else environ).get("XDG_CACHE_HOME")
    return Path(base or os.path.join(os.path.expanduser("~"), ".cache")) / "osmosis"
