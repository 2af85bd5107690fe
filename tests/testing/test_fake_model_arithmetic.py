"""The fake model's arithmetic: finding an expression in a question and formatting the answer."""

from __future__ import annotations

from fractions import Fraction

import pytest

from osmosis.testing._arithmetic import find_expression, format_number


@pytest.mark.parametrize(
    ("question", "expression", "answer"),
    [
        ("What is 17 * 23?", "17 * 23", "391"),
        ("What is 100 - 58?", "100 - 58", "42"),
        ("What is 84 / 2?", "84 / 2", "42"),
        ("What is 7 / 2?", "7 / 2", "3.5"),
        ("What is 1 / 3?", "1 / 3", "0.333333"),
        ("What is -5 + 3?", "-5 + 3", "-2"),
        ("Compute (1+2)*3 - 4/4.", "(1+2)*3 - 4/4", "8"),
        ("What is 2 + 3 * 4?", "2 + 3 * 4", "14"),
        ("What is 3 - -2?", "3 - -2", "5"),
        ("What is 0.1 + 0.2?", "0.1 + 0.2", "0.3"),
        ("What is 6 times 7?", "6 * 7", "42"),
        ("What is 1,234 plus 6?", "1234 + 6", "1240"),
        ("What is 12 x 3?", "12 * 3", "36"),
        ("Question 3: what is 2 + 2?", "2 + 2", "4"),
        ("Q1-3: what is 5*5?", "5*5", "25"),  # ties go to the last expression
        ("(what is 2+3)", "2+3", "5"),
        ("What is 2 + 2 - what?", "2 + 2", "4"),
    ],
)
def test_finds_and_evaluates_the_expression(question: str, expression: str, answer: str) -> None:
    found = find_expression(question)
    assert found is not None
    assert found.text == expression
    assert format_number(found.value) == answer


@pytest.mark.parametrize("text", ["hello", "There are 3 apples.", "What is 10 / 0?", ""])
def test_no_expression(text: str) -> None:
    assert find_expression(text) is None


def test_operands_and_operators_in_written_order() -> None:
    found = find_expression("What is -6 * 7?")
    assert found is not None
    assert found.numbers == (Fraction(-6), Fraction(7))
    assert found.operators == ("*",)
