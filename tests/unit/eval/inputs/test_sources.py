"""A rollout's sources: what is left out, the digest a resume compares (its value is pinned:
a run directory made by an earlier osmosis must still resume), and a copy holding the same."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from osmosis.eval.inputs.sources import (
    NOT_SOURCE_DIRS,
    copy_ignore,
    source_digest,
    source_files,
)


def _tree(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _listed(root: Path, **kwargs: tuple[str, ...]) -> list[str]:
    return [str(p.relative_to(root)) for p in source_files(root, **kwargs)]


@pytest.mark.parametrize(
    ("relative", "is_source"),
    [
        ("main.py", True),
        ("pkg/util.py", True),
        (".gitignore", True),  # hidden files are source
        ("build/helper.py", True),  # and what a build writes: only a build leaves it out
        (".git", True),  # a submodule's `.git` file: directories of these names are left out
        *((f"{name}/x", False) for name in sorted(NOT_SOURCE_DIRS)),
        ("pkg/__pycache__/util.cpython-311.pyc", False),
        ("legacy.pyc", False),  # compiled, wherever it is
        ("legacy.pyo", False),
        ("env/pyvenv.cfg", False),  # a virtual environment under another name (see below)
        ("env/lib/site.py", False),
        ("pyvenv.cfg", True),  # the root itself is never a venv
        ("deep/er/.venv/bin/python", False),  # at any depth
    ],
)
def test_what_is_source(tmp_path, relative, is_source):
    root = _tree(tmp_path / "rollout", {"main.py": "", "env/pyvenv.cfg": "", relative: "x"})
    assert (relative in _listed(root)) is is_source


def test_the_digest_is_sha256_over_sorted_paths_and_bytes(tmp_path):
    """Pinned: the value an existing run's manifest holds must not drift."""
    root = _tree(
        tmp_path / "rollout",
        {
            "main.py": "print(1)\n",
            "pkg/a.py": "A\n",
            "pyproject.toml": "[project]\n",
            ".venv/lib/x.py": "ignored",
            "pkg/__pycache__/a.pyc": "ignored",
        },
    )
    (root / "link").symlink_to("main.py")
    expected = hashlib.sha256()
    for relative, data in [
        ("link", b"link:main.py"),  # a link counts by where it points
        ("main.py", b"print(1)\n"),
        ("pkg/a.py", b"A\n"),
        ("pyproject.toml", b"[project]\n"),
    ]:
        expected.update(relative.encode() + b"\0" + data + b"\0")
    assert source_digest(root) == expected.hexdigest()


def test_a_caller_may_leave_out_more(tmp_path):
    root = _tree(tmp_path / "r", {"main.py": "", "build/x": "", ".env": "", "a.egg-info/P": ""})
    assert _listed(root, also_exclude=(".*", "build", "*.egg-info")) == ["main.py"]
    assert source_digest(root, also_exclude=("build",)) != source_digest(root)


def test_a_copy_holds_what_the_digest_covers(tmp_path):
    files = {"main.py": "m", "pkg/b.py": "b", ".git/HEAD": "h", "env/pyvenv.cfg": "", "x.pyc": ""}
    root = _tree(tmp_path / "rollout", {**files, "build/out": "o", "dist/w.whl": "w"})
    (root / "data").symlink_to(tmp_path, target_is_directory=True)
    copy = tmp_path / "copy"
    shutil.copytree(root, copy, symlinks=True, ignore=copy_ignore(also_exclude=("build",)))
    assert _listed(copy) == _listed(root, also_exclude=("build",))
    assert _listed(copy) == ["data", "dist/w.whl", "main.py", "pkg/b.py"]
    assert (copy / "data").is_symlink()
    assert source_digest(copy) == source_digest(root, also_exclude=("build",))
