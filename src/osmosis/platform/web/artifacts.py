"""One attempt's artifacts (`<run dir>/artifacts/row_<r>_run_<k>/...`) as the sample page
shows them: a file tree, and a preview of one file (image inline, text escaped, else size).

    tree = artifact_tree(run_dir / "artifacts" / attempt_name(0, 1))
    shown = preview(run_dir / "artifacts" / attempt_name(0, 1), "out/report.txt")

Paths come from URLs, so each is resolved inside the attempt's directory, part by part;
symbolic links are never followed and the reserved manifest.json is never served.
"""

from __future__ import annotations

import mimetypes
import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from osmosis.platform.core.errors import NotFound
from osmosis.platform.services.run_files import regular_file_within

IMAGE_TYPES = {"image/png", "image/jpeg", "image/gif", "image/webp"}
TEXT_PREVIEW_BYTES = 64 * 1024
MAX_TREE_ENTRIES = 500


def attempt_name(row_index: int, run_index: int) -> str:
    return f"row_{row_index}_run_{run_index}"


def _inside(base: Path, relative: str) -> Path:
    """`base/relative`, refusing anything that climbs out or passes through a link (and a
    name too long for the file system: a 404, not a 500)."""
    path = regular_file_within(base, [p for p in relative.split("/") if p])
    if path is None:
        raise NotFound("no such file in this run", details={"path": relative[:200]})
    return path


@dataclass
class Node:
    """A directory or file of an attempt's artifacts; `path` is relative to the attempt."""

    name: str
    path: str
    is_dir: bool
    size: int = 0
    children: list[Node] = field(default_factory=list)


@dataclass(frozen=True)
class ArtifactTree:
    root: Node
    count: int
    truncated: bool


def artifact_tree(directory: Path) -> ArtifactTree:
    """The attempt's artifact files, breadth first, at most MAX_TREE_ENTRIES of them."""
    root = Node(name="", path="", is_dir=True)
    if not directory.is_dir() or directory.is_symlink():
        return ArtifactTree(root=root, count=0, truncated=False)
    count, truncated = 0, False
    queue: deque[tuple[Path, Node]] = deque([(directory, root)])
    while queue:
        folder, node = queue.popleft()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: (not e.is_dir(), e.name))
        except OSError:
            continue
        for entry in entries:
            if entry.is_symlink() or (node is root and entry.name == "manifest.json"):
                continue
            if count >= MAX_TREE_ENTRIES:
                truncated = True
                break
            count += 1
            relative = f"{node.path}/{entry.name}" if node.path else entry.name
            if entry.is_dir():
                child = Node(name=entry.name, path=relative, is_dir=True)
                queue.append((Path(entry.path), child))
            else:
                child = Node(
                    name=entry.name, path=relative, is_dir=False, size=entry.stat().st_size
                )
            node.children.append(child)
    return ArtifactTree(root=root, count=count, truncated=truncated)


@dataclass(frozen=True)
class Preview:
    path: str
    kind: str  # "image", "text" or "binary"
    text: str = ""
    truncated: bool = False
    size: int = 0


def content_type(path: Path) -> str:
    guessed, _ = mimetypes.guess_type(path.name)
    return guessed or "application/octet-stream"


def artifact_file(directory: Path, relative: str) -> Path:
    if relative == "manifest.json":
        raise NotFound("no such file in this run", details={"path": relative})
    return _inside(directory, relative)


def preview(directory: Path, relative: str) -> Preview:
    """How to show one artifact: inline image, the start of its text, or only its size."""
    path = artifact_file(directory, relative)
    size = path.stat().st_size
    if content_type(path) in IMAGE_TYPES:
        return Preview(path=relative, kind="image", size=size)
    with path.open("rb") as handle:
        head = handle.read(TEXT_PREVIEW_BYTES)
    if b"\x00" in head:
        return Preview(path=relative, kind="binary", size=size)
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as error:
        if error.start < len(head) - 4:  # not just a character cut at the end
            return Preview(path=relative, kind="binary", size=size)
        text = head[: error.start].decode("utf-8")
    return Preview(path=relative, kind="text", text=text, truncated=size > len(head), size=size)
