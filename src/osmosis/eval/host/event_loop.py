"""The event loop the engine's hosts run on: uvloop where it is installed, else asyncio's.

    report = event_loop.run(run_evaluation(plan, reporter))   # instead of asyncio.run(...)

uvloop cuts the CPU that every HTTP exchange of an attempt costs (the rollout protocol and
the model bridge both sit in the engine process); see bench/engine.py. Rollout servers get
it without asking: uvicorn picks uvloop by itself when it is installed.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["loop_factory", "run"]

_T = TypeVar("_T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop constructor when uvloop is installed, else None (asyncio's default)."""
    if importlib.util.find_spec("uvloop") is None:
        return None
    import uvloop

    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, _T]) -> _T:
    """`asyncio.run(main)` on the loop `loop_factory()` names (Ctrl-C handled the same way)."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
