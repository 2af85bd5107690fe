"""The files `osmosis init`, `osmosis rollout init` and `osmosis template apply` write.

They ship as package data under `files/` (each stored as `<name>.tpl`, so no tool mistakes a
template `main.py` for a module of this package) and are read with `importlib.resources`, so
scaffolding works offline and needs no checkout of anything:

    files = workspace_files()              # {".gitignore": "...", "AGENTS.md": "...", ...}
    files = rollout_files("my-rollout")    # rollouts/my-rollout/main.py, configs/..., data/...
    written = write_files(Path("."), template_files("add"))

`files/workspace/` is the workspace skeleton, `files/rollout/` the `rollout init` scaffold
(`<your-rollout>` is replaced by the name), and `files/examples/<name>/` each template, laid
out as the workspace paths it writes. Standard library only: the CLI imports this at start-up
of these commands.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

__all__ = [
    "AGENT_FILES",
    "EXAMPLE",
    "TEMPLATES",
    "WORKSPACE_DIRS",
    "Template",
    "Written",
    "rollout_files",
    "rollout_name_problem",
    "template_files",
    "workspace_files",
    "write_files",
]

# What osmosis-ai's `doctor` requires (its catalog's REQUIRED_WORKSPACE_DIRS and
# OFFICIAL_AGENT_SCAFFOLD_PATHS); ours checks the same, so a workspace passes both.
WORKSPACE_DIRS: tuple[str, ...] = ("rollouts", "configs/training", "configs/eval", "data")
AGENT_FILES: tuple[str, ...] = ("AGENTS.md", "CLAUDE.md", "configs/AGENTS.md")

_ROOT = files(__name__).joinpath("files")
_SUFFIX = ".tpl"
_TOKEN = "<your-rollout>"
_NAME = re.compile(r"^[a-z][a-z0-9-]*$")
_RESERVED = frozenset({"default"})
# Stored names that differ from the written ones (a `.gitignore` in package data would be
# read by git and hatch as this package's own ignore file).
_RENAMED = {"gitignore": ".gitignore"}


@dataclass(frozen=True)
class Template:
    """A worked example `osmosis template apply NAME` adds to a workspace."""

    name: str
    description: str
    shared: tuple[str, ...] = ()
    """Files it shares with other templates (a dataset): written when absent, else kept."""
    next_steps: tuple[str, ...] = ()


EXAMPLE = "add"  # the example `osmosis init` writes (also examples/workspace in this repo)
TEMPLATES: dict[str, Template] = {
    template.name: template
    for template in (
        Template(
            "add",
            "one model call: one-digit sums answered as JSON (runs on the local model, no key)",
            shared=("data/add.jsonl",),
            next_steps=("osmosis eval run configs/eval/add.toml",),
        ),
        Template(
            "add-tools",
            "a tool-calling agent loop: the model may call an add(a, b) tool",
            shared=("data/add.jsonl",),
            next_steps=(
                "osmosis eval run configs/eval/add-tools.toml   (a model that calls tools; "
                "see the config for the scripted one)",
            ),
        ),
        Template(
            "add-openai-agents",
            "the OpenAI Agents SDK on the osmosis-ai SDK (its pyproject.toml declares both)",
            shared=("data/add.jsonl",),
            next_steps=("osmosis eval run configs/eval/add-openai-agents.toml",),
        ),
    )
}


def _walk(node: Traversable, prefix: str = "") -> Iterator[tuple[str, str]]:
    for child in sorted(node.iterdir(), key=lambda item: item.name):
        if child.is_dir():
            yield from _walk(child, f"{prefix}{child.name}/")
        elif child.name.endswith(_SUFFIX):
            stem = child.name[: -len(_SUFFIX)]
            yield prefix + _RENAMED.get(stem, stem), child.read_text(encoding="utf-8")


def workspace_files() -> dict[str, str]:
    """The skeleton of a workspace: `.gitignore`, `AGENTS.md`, `CLAUDE.md`,
    `configs/AGENTS.md`, and a `.gitkeep` in each required directory (git keeps no empty
    directory, and a clone without them fails `doctor`)."""
    skeleton = dict(_walk(_ROOT.joinpath("workspace")))
    skeleton.update({f"{directory}/.gitkeep": "" for directory in WORKSPACE_DIRS})
    return skeleton


def rollout_name_problem(name: str) -> str | None:
    """Why `name` cannot name a rollout (osmosis-ai's rule), or None."""
    if name in _RESERVED:
        return f"{name!r} is reserved and cannot name a rollout"
    if not _NAME.match(name):
        return (
            f"invalid rollout name {name!r}: use lowercase letters, digits and hyphens, "
            "starting with a letter (^[a-z][a-z0-9-]*$)"
        )
    return None


def rollout_files(name: str) -> dict[str, str]:
    """What `osmosis rollout init NAME` writes: the rollout, its two configs, sample rows."""
    layout = {
        "main.py": f"rollouts/{name}/main.py",
        "README.md": f"rollouts/{name}/README.md",
        "eval.toml": f"configs/eval/{name}.toml",
        "training.toml": f"configs/training/{name}.toml",
        "data.jsonl": f"data/{name}.jsonl",
    }
    sources = dict(_walk(_ROOT.joinpath("rollout")))
    return {dest: sources[source].replace(_TOKEN, name) for source, dest in layout.items()}


def template_files(name: str) -> dict[str, str]:
    """The files template `name` writes, by workspace path (KeyError for an unknown name)."""
    template = TEMPLATES[name]
    written = dict(_walk(_ROOT.joinpath("examples", name)))
    # Shared files (the dataset) are stored once, with the `add` example.
    stored = dict(_walk(_ROOT.joinpath("examples", EXAMPLE)))
    written.update({path: stored[path] for path in template.shared if path not in written})
    return dict(sorted(written.items()))


@dataclass
class Written:
    """What `write_files` did, by workspace path."""

    created: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    """Existing files with other content, left as they are."""


def write_files(
    root: Path,
    content: Mapping[str, str],
    *,
    replace: frozenset[str] | set[str] = frozenset(),
) -> Written:
    """Write `content` under `root`; an existing file is kept unless its path is in `replace`.

    A file whose bytes already match is `unchanged`. Parent directories are created.
    """
    written = Written()
    for relative, text in content.items():
        target = root / relative
        if target.is_file():
            if target.read_text(encoding="utf-8", errors="replace") == text:
                written.unchanged.append(relative)
                continue
            if relative not in replace:
                written.kept.append(relative)
                continue
            written.replaced.append(relative)
        else:
            written.created.append(relative)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    return written
