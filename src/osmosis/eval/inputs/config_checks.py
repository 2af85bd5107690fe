"""The rules of the eval config, applied to parsed TOML with each issue placed on its line.

`tomllib` keeps no source positions, so `LineIndex` finds them with a light line scan, and
`Checker` walks the parsed document once, collecting every `Issue` rather than stopping at the
first. `osmosis.eval.inputs.config` turns the result into the typed `EvalConfig`.
"""

from __future__ import annotations

import difflib
import math
import posixpath
import re
import tomllib
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from osmosis.eval.inputs.dataset_formats import DATASET_SUFFIXES

__all__ = ["SUPERVISOR_ENV", "Checker", "Issue", "LineIndex", "parse_issue"]

SECTIONS = ("experiment", "evaluation", "advanced", "env", "secrets")
EXPERIMENT_REQUIRED = ("rollout", "entrypoint", "model_path", "dataset")
EXPERIMENT_KEYS = (*EXPERIMENT_REQUIRED, "branch", "commit_sha")
EVALUATION_KEYS = (
    "limit",
    "n",
    "batch_size",
    "pass_threshold",
    "agent_workflow_timeout_s",
    "grader_timeout_s",
    "max_tokens_total",
    "max_cost_usd",
    "max_model_calls",
    "input_usd_per_mtok",
    "output_usd_per_mtok",
    "cache",
)
CACHE_MODES = ("off", "use", "replay")
PRICE_KEYS = ("input_usd_per_mtok", "output_usd_per_mtok")
SECRETS_KEYS = ("required",)

COMMIT_SHA = re.compile(r"^[0-9a-fA-F]{7,40}$")
ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
SECRET_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
SECRET_NAME_MAX = 255
# The supervisor sets these for every rollout process; a config value would break the protocol
# (the port, artifact root and instance id) or route the policy around the bridge.
SUPERVISOR_ENV = frozenset(
    {
        "_OSMOSIS_ROLLOUT_PORT",
        "_OSMOSIS_ROLLOUT_ARTIFACT_ROOT",
        "_OSMOSIS_ROLLOUT_INSTANCE_ID",
        "OSMOSIS_CHAT_COMPLETIONS_URL",
        "OSMOSIS_API_KEY",
        "OSMOSIS_ROLLOUT_ID",
    }
)


@dataclass(frozen=True)
class Issue:
    """One problem in a config file: where (`line`, dotted `key`) and what would be valid."""

    line: int | None
    key: str
    message: str

    def format(self, path: str | Path) -> str:
        where = f"{path}:{self.line}" if self.line is not None else str(path)
        return f"{where}: {self.key}: {self.message}" if self.key else f"{where}: {self.message}"

    def as_dict(self) -> dict[str, Any]:
        return {"line": self.line, "key": self.key, "message": self.message}


# -- TOML source positions ------------------------------------------------------------------------
_KEY_PART = r"""(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|'[^']*')"""
_HEADER = re.compile(rf"^\s*\[\[?\s*({_KEY_PART}(?:\s*\.\s*{_KEY_PART})*)\s*\]\]?\s*(?:#.*)?$")
_ASSIGN = re.compile(rf"^\s*({_KEY_PART}(?:\s*\.\s*{_KEY_PART})*)\s*=")
_PART = re.compile(_KEY_PART)
_POSITION = re.compile(r"\(at line (\d+), column (\d+)\)")


def _split_key(dotted: str) -> tuple[str, ...]:
    parts = []
    for raw in _PART.findall(dotted):
        parts.append(raw[1:-1] if raw[:1] in "\"'" else raw)
    return tuple(parts)


class LineIndex:
    """Where each table header and `key =` line sits, since `tomllib` keeps no positions.

    A light line scan: headers and assignments are found by pattern, lines inside multi-line
    strings are skipped. Keys it cannot place (inline tables) fall back to their parent's line.
    """

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()
        self.positions: dict[tuple[str, ...], int] = {}
        table: tuple[str, ...] = ()
        in_string: str | None = None
        for number, line in enumerate(self.lines, start=1):
            if in_string is not None:
                if line.count(in_string) % 2 == 1:
                    in_string = None
                continue
            header = _HEADER.match(line)
            if header:
                table = _split_key(header.group(1))
                self.positions.setdefault(table, number)
                continue
            assign = _ASSIGN.match(line)
            if assign:
                self.positions.setdefault(table + _split_key(assign.group(1)), number)
            for quote in ('"""', "'''"):
                if line.count(quote) % 2 == 1:
                    in_string = quote
                    break

    def line_of(self, *key: str) -> int | None:
        """The line of `key`, else of its nearest enclosing key or table; None if none is known."""
        for end in range(len(key), 0, -1):
            if key[:end] in self.positions:
                return self.positions[key[:end]]
        return None

    def line_of_item(self, value: str, *key: str, occurrence: int = 0) -> int | None:
        """The line of the `occurrence`-th (0-based) string `value` in the array at `key`.

        Arrays may span lines, so each item can sit on its own line.
        """
        start = self.line_of(*key)
        if start is None:
            return None
        literals = (f'"{value}"', f"'{value}'")
        seen = 0
        for number in range(start, len(self.lines) + 1):
            text = self.lines[number - 1]
            if number > start and (_HEADER.match(text) or _ASSIGN.match(text)):
                break
            seen += sum(text.count(literal) for literal in literals)
            if seen > occurrence:
                return number
        return start


def parse_issue(error: tomllib.TOMLDecodeError, text: str) -> Issue:
    message = str(error)
    position = _POSITION.search(message)
    if position:
        line = int(position.group(1))
        detail = _POSITION.sub("", message).strip()
        return Issue(line, "", f"Invalid TOML: {detail} (line {line}, column {position.group(2)})")
    # "at end of document": an unterminated string or array; point at the last line.
    line = max(1, len(text.splitlines()))
    return Issue(line, "", f"Invalid TOML: {message}")


# -- the rules ------------------------------------------------------------------------------------
def _describe(value: Any) -> str:
    kinds = {bool: "boolean", int: "integer", float: "float", str: "string", list: "array"}
    kind = kinds.get(type(value), "table" if isinstance(value, dict) else type(value).__name__)
    shown = repr(value) if not isinstance(value, (dict, list)) else kind
    return shown if isinstance(value, (dict, list)) else f"{shown} ({kind})"


def _suggest(name: str, allowed: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, allowed, n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


class Checker:
    """Walks the parsed TOML once, collecting every issue, and returns the cleaned mapping."""

    def __init__(self, index: LineIndex, workspace_root: Path | None) -> None:
        self.index = index
        self.workspace_root = workspace_root
        self.issues: list[Issue] = []

    def add(self, key: tuple[str, ...], message: str, *, line: int | None = None) -> None:
        where = line if line is not None else self.index.line_of(*key)
        self.issues.append(Issue(where, ".".join(key), message))

    def check(self, data: Mapping[str, Any]) -> dict[str, Any]:
        allowed = ", ".join(f"[{s}]" for s in SECTIONS)
        for name in data:
            if name not in SECTIONS:
                self.add(
                    (name,), f"Unrecognized section{_suggest(name, SECTIONS)}; allowed: {allowed}"
                )
        sections = {name: self.table(data, name) for name in SECTIONS}
        clean: dict[str, Any] = {}
        experiment = sections["experiment"]
        if experiment is None:
            if "experiment" not in data:
                needs = ", ".join(EXPERIMENT_REQUIRED)
                self.add(("experiment",), f"Missing required section [experiment] (needs {needs})")
        else:
            clean["experiment"] = self.experiment(experiment)
        if sections["evaluation"] is not None:
            clean["evaluation"] = self.evaluation(sections["evaluation"])
        if sections["advanced"] is not None:
            clean["advanced"] = dict(sections["advanced"])
        raw_env = sections["env"] or {}
        clean["env"] = self.env(raw_env)
        if sections["secrets"] is None:
            if "secrets" not in data:
                self.add(
                    ("secrets",),
                    "Missing required section [secrets]; add `[secrets]` with "
                    '`required = ["NAME", ...]`, or `required = []` when none are needed',
                )
        else:
            # Every [env] name counts for the overlap rule, even one that failed its own checks.
            clean["secrets"] = self.secrets(sections["secrets"], set(raw_env))
        return clean

    def table(self, data: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
        value = data.get(name)
        if value is None:
            return None
        if not isinstance(value, dict):
            self.add((name,), f"must be a table ([{name}]), got {_describe(value)}")
            return None
        return value

    def unknown_keys(self, section: str, table: Mapping[str, Any], allowed: Sequence[str]) -> None:
        for key in table:
            if key not in allowed:
                hint = _suggest(key, allowed) or f"; allowed keys: {', '.join(allowed)}"
                self.add((section, key), f"Unrecognized key{hint}")

    # [experiment] --------------------------------------------------------------------------------
    def experiment(self, table: Mapping[str, Any]) -> dict[str, Any]:
        self.unknown_keys("experiment", table, EXPERIMENT_KEYS)
        header = self.index.line_of("experiment")
        examples = {
            "rollout": 'a directory name under rollouts/, e.g. "my-rollout"',
            "entrypoint": 'a file inside rollouts/<rollout>/, e.g. "main.py"',
            "model_path": 'a LiteLLM model id, e.g. "openai/gpt-5-mini"',
            "dataset": "a dataset name (the uploaded file's stem)",
        }
        clean: dict[str, Any] = {}
        for key in EXPERIMENT_KEYS:
            if key not in table:
                if key in EXPERIMENT_REQUIRED:
                    self.add(("experiment", key), f"Field required: {examples[key]}", line=header)
                continue
            value = table[key]
            if not isinstance(value, str):
                self.add(("experiment", key), f"must be a string, got {_describe(value)}")
                continue
            problem = self.experiment_value(key, value, table)
            if problem:
                self.add(("experiment", key), problem)
            else:
                clean[key] = value
        if "branch" in table and "commit_sha" in table:
            self.add(
                ("experiment", "commit_sha"),
                "branch and commit_sha are mutually exclusive: set one of them, not both",
            )
        return clean

    def experiment_value(self, key: str, value: str, table: Mapping[str, Any]) -> str | None:
        if key in EXPERIMENT_REQUIRED and not value.strip():
            return "must not be empty"
        if key == "rollout":
            return self.rollout_problem(value)
        if key == "entrypoint":
            rollout = table.get("rollout")
            if isinstance(rollout, str) and self.rollout_problem(rollout) is None:
                return self.entrypoint_problem(rollout, value)
            return None
        if key == "dataset" and (
            "/" in value or "\\" in value or value.lower().endswith(DATASET_SUFFIXES)
        ):
            return (
                "must be a platform dataset name (the uploaded file's stem), not a path: "
                f"{value!r}; to evaluate a local file use `osmosis eval run --dataset-file`"
            )
        if key == "branch" and (not value or any(c.isspace() for c in value)):
            return f"must be a non-empty branch name without whitespace, got {value!r}"
        if key == "commit_sha" and not COMMIT_SHA.match(value):
            return f"must be 7-40 hexadecimal characters, got {value!r}"
        return None

    def rollout_problem(self, value: str) -> str | None:
        bad = (
            value in ("", ".", "..")
            or "/" in value
            or "\\" in value
            or Path(value).is_absolute()
            or value.startswith("~")
        )
        if bad:
            return (
                "must be a single directory name under rollouts/ (no '/', '\\', '.', '..' or "
                f"absolute path), got {value!r}"
            )
        if self.workspace_root is not None:
            base = (self.workspace_root / "rollouts").resolve()
            if not (base / value).resolve().is_relative_to(base):
                return f"rollouts/{value} resolves outside rollouts/ (a symlink?)"
        return None

    def entrypoint_problem(self, rollout: str, value: str) -> str | None:
        # Backslashes count as separators so a Windows-style path cannot slip past the check.
        normal = posixpath.normpath(value.replace("\\", "/"))
        outside = (
            not value.strip()
            or normal in (".", "..")
            or normal.startswith("../")
            or posixpath.isabs(normal)
            or re.match(r"^[A-Za-z]:", normal) is not None
        )
        if outside:
            return f'must be a file path inside rollouts/{rollout}/, e.g. "main.py", got {value!r}'
        if self.workspace_root is not None:
            base = (self.workspace_root / "rollouts" / rollout).resolve()
            if not (base / normal).resolve().is_relative_to(base):
                return (
                    f"rollouts/{rollout}/{value} resolves outside rollouts/{rollout}/ (a symlink?)"
                )
        return None

    # [evaluation] --------------------------------------------------------------------------------
    def evaluation(self, table: Mapping[str, Any]) -> dict[str, Any]:
        self.unknown_keys("evaluation", table, EVALUATION_KEYS)
        clean: dict[str, Any] = {}
        for key in ("limit", "n", "batch_size", "max_tokens_total", "max_model_calls"):
            if key in table:
                value = table[key]
                if type(value) is not int or value < 1:
                    self.add(
                        ("evaluation", key), f"must be an integer >= 1, got {_describe(value)}"
                    )
                else:
                    clean[key] = value
        if "pass_threshold" in table:
            value = table["pass_threshold"]
            if not _is_number(value) or not math.isfinite(value):
                message = f"must be a finite number (a reward >= it passes), got {_describe(value)}"
                self.add(("evaluation", "pass_threshold"), message)
            else:
                clean["pass_threshold"] = float(value)
        for key in ("agent_workflow_timeout_s", "grader_timeout_s"):
            if key in table:
                value = table[key]
                if not _is_number(value) or not math.isfinite(value) or value <= 0:
                    message = f"must be a positive finite number of seconds, got {_describe(value)}"
                    self.add(("evaluation", key), message)
                else:
                    clean[key] = float(value)
        if "max_cost_usd" in table:
            value = table["max_cost_usd"]
            if not _is_number(value) or not math.isfinite(value) or value <= 0:
                message = f"must be a positive finite number of dollars, got {_describe(value)}"
                self.add(("evaluation", "max_cost_usd"), message)
            else:
                clean["max_cost_usd"] = float(value)
        for key in PRICE_KEYS:
            if key in table:
                value = table[key]
                if not _is_number(value) or not math.isfinite(value) or value < 0:
                    message = f"must be a finite number of USD >= 0, got {_describe(value)}"
                    self.add(("evaluation", key), message)
                else:
                    clean[key] = float(value)
        if "cache" in table:
            value = table["cache"]
            if value not in CACHE_MODES or not isinstance(value, str):
                message = f'must be "off", "use" or "replay", got {_describe(value)}'
                self.add(("evaluation", "cache"), message)
            else:
                clean["cache"] = value
        given = [key for key in PRICE_KEYS if key in table]
        if len(given) == 1:
            other = next(key for key in PRICE_KEYS if key not in table)
            self.add(("evaluation", given[0]), f"a price override needs {other} too")
        return clean

    # [env] and [secrets] -------------------------------------------------------------------------
    def env(self, table: Mapping[str, Any]) -> dict[str, str]:
        clean: dict[str, str] = {}
        for name, value in table.items():
            key = ("env", name)
            if not ENV_NAME.match(name):
                self.add(
                    key,
                    "invalid variable name: use A-Z, 0-9 and _, not starting with a digit "
                    "(^[A-Z_][A-Z0-9_]*$)",
                )
            elif name in SUPERVISOR_ENV:
                self.add(key, "is set by the supervisor for every rollout and cannot be overridden")
            elif name.startswith("_OSMOSIS_"):
                self.add(key, "names starting with _OSMOSIS_ are reserved for the supervisor")
            elif not isinstance(value, str):
                self.add(
                    key, f'must be a string (quote it: {name} = "..."), got {_describe(value)}'
                )
            else:
                clean[name] = value
        return clean

    def secrets(self, table: Mapping[str, Any], env_names: Set[str]) -> dict[str, Any]:
        key = ("secrets", "required")
        mapped = {name: value for name, value in table.items() if name != "required"}
        if mapped and "required" not in table and all(isinstance(v, str) for v in mapped.values()):
            # `OPENAI_API_KEY = "openai-api-key"`: the older form (still in Osmosis's workspace
            # template) that mapped a variable to a secret record. Name the current one.
            names = ", ".join(f'"{name}"' for name in mapped)
            first, record = next(iter(mapped.items()))
            self.add(
                ("secrets",),
                f'uses the older mapping form ({first} = "{record}"); list the names instead: '
                f"required = [{names}] (each value comes from --secrets-file or the "
                f"environment, or on the platform from the secret of that name: osmosis "
                f"secret set {first})",
            )
            return {}
        self.unknown_keys("secrets", table, SECRETS_KEYS)
        if "required" not in table:
            message = (
                'Field required: a list of secret names, e.g. required = ["OPENAI_API_KEY"], or []'
            )
            self.add(key, message, line=self.index.line_of("secrets"))
            return {}
        names = table["required"]
        if not isinstance(names, list):
            self.add(key, f"must be a list of secret names, got {_describe(names)}")
            return {}
        clean: list[str] = []
        seen: dict[str, int] = {}
        for position, name in enumerate(names):
            if not isinstance(name, str):
                self.add(key, f"item {position} must be a string, got {_describe(name)}")
                continue
            line = self.index.line_of_item(name, *key, occurrence=seen.get(name, 0))
            if not SECRET_NAME.match(name) or len(name) > SECRET_NAME_MAX:
                self.add(
                    key,
                    f"{name!r} is not a valid secret name: use A-Z, 0-9 and _, starting with a "
                    "letter, at most 255 characters (^[A-Z][A-Z0-9_]*$)",
                    line=line,
                )
            elif name in seen:
                self.add(key, f"{name!r} is listed more than once", line=line)
            elif name in env_names:
                self.add(
                    key,
                    f"{name!r} is also set in [env]; a variable comes from [env] or [secrets], "
                    "not both",
                    line=line,
                )
            else:
                clean.append(name)
            seen[name] = seen.get(name, 0) + 1
        return {"required": tuple(clean)}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
