"""An eval config written back as TOML from its values, in the form `parse_eval_config` reads.

    text = config_text(experiment={...}, evaluation={"n": 2}, advanced={}, env={}, required=[])

Used where only values exist (the official CLI's submit, which sends no file) and where a
file's values were overridden (`eval submit --model/-n/--limit`): the text sent must say what
runs. A value TOML cannot hold raises ValueError naming it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any


def config_text(
    *,
    experiment: Mapping[str, Any],
    evaluation: Mapping[str, Any],
    advanced: Mapping[str, Any],
    env: Mapping[str, str],
    required: Sequence[str],
) -> str:
    """The eval config the values describe, as TOML (`[secrets]` always, others if set)."""
    tables: list[tuple[str, Mapping[str, Any]]] = [("experiment", experiment)]
    optional = (("evaluation", evaluation), ("advanced", advanced), ("env", env))
    tables += [(name, values) for name, values in optional if values]
    tables.append(("secrets", {"required": list(required)}))
    out: list[str] = []
    for name, values in tables:
        out.append(f"[{name}]")
        out += [
            f"{_key(key)} = {_value(value)}" for key, value in values.items() if value is not None
        ]
        out.append("")
    return "\n".join(out)


def _key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        # A JSON string is a TOML basic string once DEL, which TOML forbids raw, is escaped.
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007F")
    if isinstance(value, Mapping):
        inner = ", ".join(f"{_key(str(k))} = {_value(v)}" for k, v in value.items())
        return "{" + inner + "}"
    if isinstance(value, Sequence):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    raise ValueError(f"{value!r} cannot be written in an eval config")


__all__ = ["config_text"]
