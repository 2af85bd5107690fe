"""`ctx.artifacts_dir`, created the first time a workflow or grader reads it.

Most rollouts write no artifacts, and creating two directories per attempt was a fast
rollout's largest file-system cost (and left the engine an empty folder to inspect). The
backend hands the contexts a `PendingDirectory`; reading the field creates it and returns a
plain `Path` (or None when it cannot be created, as before). A `Path` assigned or passed in
is kept as it is.

    ctx = AgentWorkflowContext(prompt=messages, artifacts_dir=PendingDirectory(path))
    (ctx.artifacts_dir / "notes.txt").write_text("...")   # the directory exists from here
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any, overload

__all__ = ["ArtifactsDirField", "PendingDirectory"]

logger = logging.getLogger("osmosis.rollout")


class PendingDirectory:
    """A directory to create on first use: `resolve()` makes it (and its parent)."""

    __slots__ = ("_created", "path")

    def __init__(self, path: Path) -> None:
        self.path = path
        self._created: bool | None = None  # None: not tried yet

    def resolve(self) -> Path | None:
        """The directory, created now if it was not; None when it cannot be."""
        if self._created is None:
            self._created = _make(self.path)
        return self.path if self._created else None


class ArtifactsDirField:
    """A dataclass field holding a `Path`, None, or a `PendingDirectory` resolved on read."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._slot = f"_{name}"

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> None: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> Path | None: ...
    def __get__(self, obj: object | None, owner: type | None = None) -> Path | None:
        if obj is None:
            return None  # the dataclass default
        value: Any = obj.__dict__.get(self._slot)
        if isinstance(value, PendingDirectory):
            return value.resolve()
        return value  # type: ignore[no-any-return]

    def __set__(self, obj: object, value: Path | PendingDirectory | None) -> None:
        obj.__dict__[self._slot] = value


def _make(path: Path) -> bool:
    # Two plain mkdirs: Path.mkdir(parents=True) tries the leaf first, failing, every time.
    try:
        try:
            os.mkdir(path.parent)
        except FileNotFoundError:
            path.parent.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            pass
        with contextlib.suppress(FileExistsError):
            os.mkdir(path)
    except OSError:
        logger.warning("cannot create artifacts directory %s", path, exc_info=True)
        return False
    return True
