"""Find an arithmetic expression in a question and evaluate it exactly.

The fake model "knows" arithmetic so that an end-to-end evaluation has right answers to grade:
"What is 17 * 23?" answers 391. Only + - * /, parentheses, unary minus and decimal numbers are
understood; evaluation uses `Fraction`, so 0.1 + 0.2 is 0.3 and 7 / 2 is 3.5.

    >>> found = find_expression("What is 17 * 23?")
    >>> found.text, format_number(found.value)
    ('17 * 23', '391')
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

# Words people write between numbers, turned into symbols before tokenizing.
_WORD_OPERATORS = (
    (re.compile(r"(?<=\d)\s+(?:plus|added to)\s+(?=[-(\d])", re.I), " + "),
    (re.compile(r"(?<=\d)\s+minus\s+(?=[-(\d])", re.I), " - "),
    (re.compile(r"(?<=\d)\s+(?:times|multiplied by)\s+(?=[-(\d])", re.I), " * "),
    (re.compile(r"(?<=\d)\s+divided by\s+(?=[-(\d])", re.I), " / "),
    (re.compile("(?<=\\d)\\s*[x\u00d7]\\s*(?=\\d)"), " * "),  # x and the multiplication sign
    (re.compile("\u00f7"), " / "),  # the division sign
    (re.compile(r"(?<=\d),(?=\d{3}\b)"), ""),  # thousands separators: 1,234
)


@dataclass(frozen=True)
class Expression:
    """An expression found in text: its source, its value, its operands and operators in
    the order they are written."""

    text: str
    value: Fraction
    numbers: tuple[Fraction, ...]
    operators: tuple[str, ...]


# Words and other text become one "other" token each, so a sentence costs a few tokens.
_TOKEN = re.compile(r"(\d+(?:\.\d+)?)|([-+*/()])|([^\d\s()*/+-]+)")
_HAS_DIGIT = re.compile(r"\d")


@dataclass(frozen=True)
class _Token:
    kind: str  # "num", "op" or "other"
    text: str
    start: int
    end: int


def _tokenize(text: str) -> list[_Token]:
    tokens = []
    for match in _TOKEN.finditer(text):
        kind = "num" if match.lastindex == 1 else "op" if match.lastindex == 2 else "other"
        tokens.append(_Token(kind, match.group(), match.start(), match.end()))
    return tokens


class _Parser:
    """Recursive descent over tokens; each method returns the position after what it parsed."""

    def __init__(self, tokens: list[_Token]) -> None:
        self.tokens = tokens
        self.numbers: list[Fraction] = []
        self.operators: list[tuple[int, str]] = []  # (token position, operator)

    def _op(self, pos: int) -> str | None:
        if pos < len(self.tokens) and self.tokens[pos].kind == "op":
            return self.tokens[pos].text
        return None

    def expression(self, pos: int) -> tuple[Fraction, int] | None:
        first = self.term(pos)
        if first is None:
            return None
        value, pos = first
        while (op := self._op(pos)) in ("+", "-"):
            # Backtrack when the operator is not followed by a term: "2 + 2 - what?" is 2 + 2.
            mark = (len(self.numbers), len(self.operators))
            right = self.term(pos + 1)
            if right is None:
                self._rewind(mark)
                break
            self.operators.append((pos, op))
            value = value + right[0] if op == "+" else value - right[0]
            pos = right[1]
        return value, pos

    def term(self, pos: int) -> tuple[Fraction, int] | None:
        first = self.factor(pos)
        if first is None:
            return None
        value, pos = first
        while (op := self._op(pos)) in ("*", "/"):
            mark = (len(self.numbers), len(self.operators))
            right = self.factor(pos + 1)
            if right is None or (op == "/" and right[0] == 0):
                self._rewind(mark)
                break
            self.operators.append((pos, op))
            value = value * right[0] if op == "*" else value / right[0]
            pos = right[1]
        return value, pos

    def factor(self, pos: int) -> tuple[Fraction, int] | None:
        if pos >= len(self.tokens):
            return None
        token = self.tokens[pos]
        if token.kind == "num":
            value = Fraction(int(token.text)) if token.text.isdigit() else Fraction(token.text)
            self.numbers.append(value)
            return value, pos + 1
        if token.text == "-":
            following = self.tokens[pos + 1] if pos + 1 < len(self.tokens) else None
            if following is not None and following.kind == "num":  # a negative literal
                value = -Fraction(following.text)
                self.numbers.append(value)
                return value, pos + 2
            inner = self.factor(pos + 1)
            return None if inner is None else (-inner[0], inner[1])
        if token.text == "(":
            mark = (len(self.numbers), len(self.operators))
            inner = self.expression(pos + 1)
            if inner is None or self._op(inner[1]) != ")":
                self._rewind(mark)
                return None
            return inner[0], inner[1] + 1
        return None

    def _rewind(self, mark: tuple[int, int]) -> None:
        del self.numbers[mark[0] :]
        del self.operators[mark[1] :]


@lru_cache(maxsize=4096)  # evaluations ask the same questions again and again (k runs per row)
def find_expression(text: str) -> Expression | None:
    """The arithmetic expression in `text` with the most operators (the last one on a tie).

    A lone number is not an expression: "Question 3: what is 2 + 2?" finds "2 + 2".
    """
    if _HAS_DIGIT.search(text) is None:  # the common case for echo prompts: nothing to parse
        return None
    for pattern, replacement in _WORD_OPERATORS:
        text = pattern.sub(replacement, text)
    tokens = _tokenize(text)
    best: Expression | None = None
    pos = 0
    while pos < len(tokens):
        parser = _Parser(tokens)
        first = tokens[pos]
        startable = first.kind == "num" or first.text in ("(", "-")
        parsed = parser.expression(pos) if startable else None
        if parsed is None or not parser.operators:
            pos += 1
            continue
        value, end = parsed
        found = Expression(
            text=text[tokens[pos].start : tokens[end - 1].end],
            value=value,
            numbers=tuple(parser.numbers),
            operators=tuple(op for _, op in sorted(parser.operators)),
        )
        if best is None or len(found.operators) >= len(best.operators):
            best = found
        pos = end
    return best


def format_number(value: Fraction) -> str:
    """An integer as digits; anything else as a decimal with at most 6 places: 3.5, 0.333333."""
    if value.denominator == 1:
        return str(value.numerator)
    text = f"{float(value):.6f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text
