"""Plausible arguments for a tool call, filled from the tool's JSON schema and the question.

A fake agent run is only useful if the tool receives arguments it can use: asked "What is
17 * 23?" with a tool `multiply(a: number, b: number)`, the fake model calls it with
`{"a": 17, "b": 23}`. Numbers fill numeric parameters in order, an enum picks the value that
names the operator, an "expression" parameter gets the expression, and other strings get
the question.

    fill_arguments({"properties": {"a": {"type": "number"}}}, "What is 4 + 5?", None)
    # {"a": 4}
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from osmosis.testing._arithmetic import Expression

_OPERATOR_NAMES = {
    "+": {"+", "add", "addition", "plus", "sum"},
    "-": {"-", "sub", "subtract", "subtraction", "minus", "difference"},
    "*": {"*", "x", "mul", "multiply", "multiplication", "times", "product"},
    "/": {"/", "div", "divide", "division", "quotient"},
}
_EXPRESSION_NAMES = {"expression", "expr", "formula", "equation", "calculation", "math"}
_OPERATOR_PARAMETERS = {"op", "operator", "operation"}
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _json_number(value: Fraction, integer: bool) -> int | float:
    if integer or value.denominator == 1:
        return int(value)
    return float(value)


def _schema_type(schema: Mapping[str, Any]) -> str | None:
    kind = schema.get("type")
    if isinstance(kind, list):  # ["number", "null"]: the first concrete type
        kind = next((k for k in kind if k != "null"), None)
    return kind if isinstance(kind, str) else None


def fill_arguments(
    parameters: Mapping[str, Any] | None, question: str, expression: Expression | None
) -> dict[str, Any]:
    """Arguments for every property of a JSON-schema `parameters` object, deterministically."""
    properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
    if not isinstance(properties, Mapping):
        return {}
    if expression is not None:
        numbers = list(expression.numbers)
        operator = expression.operators[0]
    else:
        numbers = [Fraction(n) for n in _NUMBER.findall(question)]
        operator = None

    arguments: dict[str, Any] = {}
    for name, raw_schema in properties.items():
        schema = raw_schema if isinstance(raw_schema, Mapping) else {}
        kind = _schema_type(schema)
        enum = schema.get("enum")
        if isinstance(enum, list) and enum:
            names = _OPERATOR_NAMES.get(operator or "", set())
            arguments[name] = next((v for v in enum if str(v).lower() in names), enum[0])
        elif kind in ("number", "integer"):
            value = numbers.pop(0) if numbers else Fraction(0)
            arguments[name] = _json_number(value, integer=kind == "integer")
        elif kind == "boolean":
            arguments[name] = True
        elif kind == "array":
            arguments[name] = []
        elif kind == "object":
            arguments[name] = {}
        elif name.lower() in _OPERATOR_PARAMETERS and operator is not None:
            arguments[name] = operator
        elif name.lower() in _EXPRESSION_NAMES and expression is not None:
            arguments[name] = expression.text
        else:
            arguments[name] = question
    return arguments
