"""The words every part of osmosis shares, each defined once: statuses, the pass rule, sizes.

The engine, the platform (its tables, routes and dashboard), the wire schemas and the command
line all import these; none defines its own. Standard library only, so anything may import it.

    passes(0.8, threshold=0.5)        # True: a graded attempt passes when reward >= threshold
    format_bytes(3 * 1024**2)         # '3.0 MiB'
"""

from __future__ import annotations

from typing import Final, Literal, get_args

#: How an attempt ended: graded or not (`success`), crashed or timed out (`failed`, with an
#: error type), or removed by its grader (`skipped`).
AttemptStatus = Literal["success", "failed", "skipped"]
ATTEMPT_STATUSES: Final[tuple[AttemptStatus, ...]] = get_args(AttemptStatus)

#: Where a platform run is in its life.
RunStatus = Literal["pending", "running", "finished", "failed", "stopped"]
RUN_STATUSES: Final[tuple[RunStatus, ...]] = get_args(RunStatus)

#: The largest page any list route serves, and the client asks for.
MAX_PAGE: Final = 50


def passes(reward: float | None, threshold: float) -> bool:
    """The pass rule: a graded attempt passes when its reward reaches the threshold."""
    return reward is not None and reward >= threshold


def format_bytes(count: int) -> str:
    """A byte count for people in binary units, as the download layout counts: `4.2 KiB`."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # the loop returns at GiB


__all__ = [
    "ATTEMPT_STATUSES",
    "MAX_PAGE",
    "RUN_STATUSES",
    "AttemptStatus",
    "RunStatus",
    "format_bytes",
    "passes",
]
