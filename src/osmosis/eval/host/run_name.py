"""A run's default name: `<config stem>-<UTC time>` (`smoke-20260105-142233`).

    default_run_name(Path("configs/eval/smoke.toml"))  # 'smoke-20260105-142233'

The standard library only: the command line computes it at its entry, before it loads the
planner, to start the run's rollout server early (`osmosis.cli.prestart`); `plan_run` gives a
run without `--name` the same one.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path


def default_run_name(config_path: Path, now: datetime | None = None) -> str:
    """The name of a run of `config_path` started at `now` (default: this second, UTC)."""
    return f"{config_path.stem}-{(now or datetime.now(UTC)):%Y%m%d-%H%M%S}"


__all__ = ["default_run_name"]
