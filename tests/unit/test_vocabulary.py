"""The shared vocabulary (`osmosis.vocabulary`): its words, its two rules, and a grep of the
source tree that fails when a second definition of any of them appears.

What counts as a second definition, read from every module's syntax tree (so prose in
docstrings, comments and help texts never counts):

- an assignment to `MAX_PAGE`;
- a tuple, list, set or `Literal[...]` spelling every status of one status vocabulary, or an
  SQL string quoting them all (`status IN ('success', 'failed', 'skipped')`);
- the pass rule: a reward compared with a threshold, or anything with a pass threshold, by
  `>=`/`<=` (templates too); a gate on a metric (`value >= threshold`) is another rule;
- a byte formatter: a unit word (`"KiB"`, `"MB"`) as a string of its own, or written after a
  formatted number (`f"{size:.1f} KB"`);
- a second list of what is not source (a collection naming two or more of its directories).

Database migrations are history: they keep their own literal copy of the schema.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

import osmosis
import osmosis.vocabulary as vocabulary
from osmosis.eval.inputs.sources import NOT_SOURCE_DIRS
from osmosis.vocabulary import (
    ATTEMPT_STATUSES,
    LOCAL_RUN_STATUSES,
    OUTCOME_LABELS,
    OUTCOMES,
    RUN_STATUSES,
    TERMINAL_RUN_STATUSES,
    count_outcomes,
    describe_outcomes,
    format_bytes,
    outcome,
    outcomes_of_counts,
    pass_clause,
    passes,
)

PACKAGE = Path(osmosis.__file__).parent
HOME = PACKAGE / "vocabulary.py"
SOURCES_HOME = PACKAGE / "eval" / "inputs" / "sources.py"
MIGRATIONS = PACKAGE / "platform" / "core" / "db" / "migrations"
VOCABULARIES = {
    "attempt statuses": frozenset(ATTEMPT_STATUSES),
    "run statuses": frozenset(RUN_STATUSES),
    "terminal run statuses": frozenset(TERMINAL_RUN_STATUSES),
    "local run statuses": frozenset(LOCAL_RUN_STATUSES),
    "outcomes": frozenset(OUTCOMES),
}
# Second definitions left in place on purpose, each with its reason.
KNOWN: set[tuple[str, str]] = set()
UNITS = re.compile(r"[KMGT]i?B")
UNIT_AFTER_NUMBER = re.compile(r"\s*[KMGT]i?B\b")


def test_the_public_names_are_pinned():
    assert vocabulary.__all__ == [
        "ATTEMPT_STATUSES",
        "DEFAULT_PASS_THRESHOLD",
        "LOCAL_RUN_STATUSES",
        "MAX_PAGE",
        "OUTCOMES",
        "OUTCOME_LABELS",
        "RUN_STATUSES",
        "TERMINAL_RUN_STATUSES",
        "AttemptStatus",
        "LocalRunStatus",
        "Outcome",
        "RunStatus",
        "count_outcomes",
        "describe_outcomes",
        "format_bytes",
        "format_rate",
        "outcome",
        "outcomes_of_counts",
        "pass_clause",
        "passes",
    ]
    for name in vocabulary.__all__:
        assert getattr(vocabulary, name) is not None


def test_the_words():
    assert ATTEMPT_STATUSES == ("success", "failed", "skipped")
    assert RUN_STATUSES == ("pending", "running", "finished", "failed", "stopped", "halted")
    assert set(TERMINAL_RUN_STATUSES) < set(RUN_STATUSES)
    assert LOCAL_RUN_STATUSES == ("running", "finished", "incomplete")
    assert OUTCOMES == ("passed", "not_passed", "errored", "skipped")
    assert list(OUTCOME_LABELS) == list(OUTCOMES)
    assert vocabulary.MAX_PAGE == 50
    assert vocabulary.DEFAULT_PASS_THRESHOLD == 1.0


@pytest.mark.parametrize(
    ("reward", "threshold", "expected"),
    [
        (1.0, 1.0, True),  # reaching the threshold passes
        (0.999, 1.0, False),
        (1.5, 1.0, True),
        (0.0, 0.0, True),
        (-0.5, 0.0, False),
        (-1.0, -1.0, True),  # thresholds may be negative
        (None, 0.0, False),  # no reward (not graded) never passes
        (None, -1e9, False),
    ],
)
def test_passes(reward, threshold, expected):
    assert passes(reward, threshold) is expected


@pytest.mark.parametrize(
    ("status", "reward", "threshold", "expected"),
    [
        ("success", 1.0, 1.0, "passed"),
        ("success", 0.0, 1.0, "not_passed"),  # a wrong answer is not an error
        ("success", None, 0.0, "not_passed"),  # not graded never passes
        ("failed", None, 1.0, "errored"),
        ("failed", 1.0, 1.0, "errored"),  # an imported failed row may carry a reward
        ("skipped", None, 1.0, "skipped"),
    ],
)
def test_outcome(status, reward, threshold, expected):
    assert outcome(status, reward, threshold) == expected


def test_count_outcomes_names_every_outcome():
    attempts = [("success", 1.0), ("success", 0.0), ("failed", None), ("failed", None)]
    assert count_outcomes(attempts, 1.0) == {
        "passed": 1,
        "not_passed": 1,
        "errored": 2,
        "skipped": 0,
    }
    assert describe_outcomes(count_outcomes(attempts, 1.0)) == (
        "1 passed, 1 not passed, 2 errored, 0 skipped"
    )
    older = outcomes_of_counts(completed=4, passed=1, failed=2, skipped=0)
    assert older == count_outcomes(attempts, 1.0)
    assert describe_outcomes({}, sep=" · ") == "0 passed · 0 not passed · 0 errored · 0 skipped"


def test_the_sql_form_of_the_pass_rule_is_the_same_comparison():
    from sqlalchemy import Float, column

    clause = pass_clause(column("reward", Float), 0.5)
    assert str(clause.compile(compile_kwargs={"literal_binds": True})) == "reward >= 0.5"
    assert pass_clause(0.5, 0.5) is True


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        (0, "0 B"),
        (313, "313 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (4300, "4.2 KiB"),
        (3 * 1024**2, "3.0 MiB"),
        (1024**3 - 1, "1024.0 MiB"),
        (5 * 1024**3 + 1024**3 // 2, "5.5 GiB"),
        (4096 * 1024**3, "4096.0 GiB"),  # GiB is the largest unit
    ],
)
def test_format_bytes(count, expected):
    assert format_bytes(count) == expected


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        (4 * 1024**3, "4 GiB"),
        (512 * 1024**2, "512 MiB"),
        (1536 * 1024**2, "1536 MiB"),  # the largest unit that divides it
        (32 * 1024, "32 KiB"),
        (1500, "1500 bytes"),  # no unit divides it
        (0, "0 bytes"),
    ],
)
def test_format_bytes_exact_states_a_limit(count, expected):
    assert format_bytes(count, exact=True) == expected


# -- one definition each -------------------------------------------------------------------------
@cache
def _modules() -> dict[Path, ast.Module]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == HOME or MIGRATIONS in path.parents:
            continue
        if "templates" in path.relative_to(PACKAGE).parts[:1]:
            continue  # files copied into users' workspaces
        found[path] = ast.parse(path.read_text(), str(path))
    return found


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(PACKAGE.parent)}:{getattr(node, 'lineno', '?')}"


def _strings(node: ast.AST) -> list[str]:
    elements = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else []
    return [e.value for e in elements if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def _named(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _exports(tree: ast.Module) -> set[int]:
    """ids of the string nodes listed in `__all__`: names, not words."""
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(_named(t) == "__all__" for t in node.targets):
            ids.update(id(child) for child in ast.walk(node.value))
    return ids


def _findings() -> Iterator[tuple[str, str]]:
    quoted = {
        name: [re.compile(rf"'{re.escape(word)}'") for word in words]
        for name, words in VOCABULARIES.items()
    }
    for path, tree in _modules().items():
        exported = _exports(tree)
        for node in ast.walk(tree):
            where = _where(path, node)
            if isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(_named(t) == "MAX_PAGE" for t in targets):
                    yield "MAX_PAGE", where
            words = set(_strings(node))
            if isinstance(node, ast.Subscript) and _named(node.value) == "Literal":
                inner = node.slice
                words = set(_strings(inner)) or set(_strings(ast.Tuple(elts=[inner])))
            for name, vocabulary_words in VOCABULARIES.items():
                if vocabulary_words <= words:
                    yield name, where
            if path != SOURCES_HOME and len(NOT_SOURCE_DIRS & words) >= 2:
                yield "what is not source", where
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for name, patterns in quoted.items():
                    if all(p.search(node.value) for p in patterns):
                        yield f"{name} (SQL)", where
                if UNITS.fullmatch(node.value) and id(node) not in exported:
                    yield "byte formatter", where
            if isinstance(node, ast.JoinedStr):
                for before, part in zip(node.values, node.values[1:], strict=False):
                    if (
                        isinstance(before, ast.FormattedValue)
                        and isinstance(part, ast.Constant)
                        and UNIT_AFTER_NUMBER.match(str(part.value))
                    ):
                        yield "byte formatter", where
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                for op, left, right in zip(node.ops, sides, sides[1:], strict=False):
                    names = (_named(left), _named(right))
                    if (
                        isinstance(op, ast.GtE | ast.LtE)
                        and any("threshold" in name for name in names)
                        and any("reward" in name or "pass_threshold" in name for name in names)
                    ):
                        yield "the pass rule", where
    for path in sorted((PACKAGE / "platform" / "web").rglob("*")):
        if path.suffix in (".html", ".js"):
            text = path.read_text()
            for match in re.finditer(r"(>=|<=)\s*\w*threshold", text):
                line = text.count("\n", 0, match.start()) + 1
                yield "the pass rule", f"{path.relative_to(PACKAGE.parent)}:{line}"


def test_each_word_is_defined_once():
    """Everything else imports `osmosis.vocabulary` (and `osmosis.eval.inputs.sources`)."""
    found = sorted(
        (what, where)
        for what, where in set(_findings())
        if (what, where.partition(":")[0]) not in KNOWN
    )
    said = [f"{where}: a second definition of {what}" for what, where in found]
    assert found == [], "\n".join(said)


def test_the_grep_finds_what_it_looks_for(tmp_path, monkeypatch):
    """The checks above are not vacuous: each one finds its own kind of second definition."""
    module = tmp_path / "osmosis" / "copy.py"
    module.parent.mkdir()
    module.write_text(
        "from typing import Literal\n"
        "MAX_PAGE = 50\n"
        'Status = Literal["success", "failed", "skipped"]\n'
        'RUNS = ("pending", "running", "finished", "failed", "stopped", "halted")\n'
        "CHECK = \"status IN ('success', 'failed', 'skipped')\"\n"
        "ok = reward >= pass_threshold\n"
        "gate = value >= threshold\n"
        'size = f"{count / 1000:.1f} KB"\n'
        'UNITS = ("B", "KiB")\n'
        'SKIP = {".git", "__pycache__"}\n'
        '__all__ = ["GiB"]\n'
    )
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "osmosis")
    _modules.cache_clear()
    try:
        found = sorted(what for what, _ in set(_findings()))
    finally:
        _modules.cache_clear()
    assert found == [
        "MAX_PAGE",
        "attempt statuses",
        "attempt statuses (SQL)",
        "byte formatter",
        "byte formatter",
        "run statuses",
        "terminal run statuses",
        "the pass rule",
        "what is not source",
    ]
