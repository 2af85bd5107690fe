"""The processes below one, read from Linux's /proc. The standard library only.

for pid in descendants(server.pid):   # what it started, and what those started
    ...
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator


def descendants(pid: int) -> Iterator[int]:
    """Every process `pid` started and every one those started, breadth first (`pid` itself
    not included). A process that ends meanwhile is skipped, and what was below it too."""
    pending, seen = deque([pid]), {pid}
    while pending:
        parent = pending.popleft()
        try:
            children = [
                int(child)
                for task in os.listdir(f"/proc/{parent}/task")
                for child in _read(f"/proc/{parent}/task/{task}/children").split()
            ]
        except (OSError, ValueError):
            continue
        for child in children:
            if child not in seen:
                seen.add(child)
                yield child
                pending.append(child)


def _read(path: str) -> str:
    with open(path) as file:
        return file.read()


__all__ = ["descendants"]
