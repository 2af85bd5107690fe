"""Secrets for local runs: dotenv parsing and resolution order."""

import pytest

from osmosis.eval.secrets import SecretsError, parse_dotenv, resolve_secrets


def test_dotenv_lines_comments_export_and_quotes():
    text = "# comment\nexport A=1\nB = 'two words'\nC=\"x=y\"\n\nD=\n"
    assert parse_dotenv(text) == {"A": "1", "B": "two words", "C": "x=y", "D": ""}


def test_every_malformed_line_is_reported_with_its_number():
    with pytest.raises(SecretsError) as error:
        parse_dotenv("A=1\nnot a pair\n9X=2\n", source="s.env")
    assert error.value.problems == [
        "s.env:2: expected NAME=value, got 'not a pair'",
        "s.env:3: expected NAME=value, got '9X=2'",
    ]


def test_file_wins_over_environment_and_all_missing_are_named():
    resolved = resolve_secrets(
        ["A", "B"], file_values={"A": "from-file"}, environ={"A": "env", "B": "env-b"}
    )
    assert resolved.values == {"A": "from-file", "B": "env-b"}
    assert resolved.sources == {"A": "file", "B": "environment"}
    with pytest.raises(SecretsError) as error:
        resolve_secrets(["A", "B", "C"], file_values={}, environ={"B": ""})
    assert error.value.missing == ["A", "B", "C"]
