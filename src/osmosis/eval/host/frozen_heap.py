"""Keeping what a run starts with out of the garbage collector's full passes while it
dispatches.

    with frozen_heap():
        outcome = await engine.run(items)

By the first dispatch the engine process holds a few hundred thousand objects that live as
long as it does: modules, classes, the plan, the bridge. CPython's full collection walks all
of them; the first one of a run came as wave 0's results did and stopped the event loop for
~18 ms (bench/engine.py (b), 200 ms, 64 in flight), delaying those results and the next
wave's admissions. `gc.freeze()` moves them to a generation no collection walks; on the way
out they go back (`gc.unfreeze()`), so a process that hosts many runs (the platform worker)
collects what they left behind. Runs that overlap in one process share one freeze: the last
to finish thaws it.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

__all__ = ["frozen_heap"]

_lock = threading.Lock()
_holders = 0


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Freeze the objects alive now for the span of the block (see the module docstring)."""
    global _holders
    with _lock:
        _holders += 1
        gc.freeze()  # again for a later run: what the earlier ones made since is frozen too
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0:
                gc.unfreeze()
