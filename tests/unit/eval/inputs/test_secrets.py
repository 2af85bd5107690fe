"""Secrets for local runs: dotenv parsing and resolution order."""

import pytest

from osmosis.eval.inputs.secrets import (
    SecretsError,
    parse_dotenv,
    resolve_secrets,
    short_secret_warnings,
)


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


def test_short_secrets_are_named_in_a_warning_and_their_values_never_shown():
    resolved = resolve_secrets(
        ["OPENAI_API_KEY", "JUDGE_KEY", "PIN"],
        file_values={"OPENAI_API_KEY": "Q", "PIN": "7Zq9Pw"},
        environ={"JUDGE_KEY": "sk-judge-0123456789"},
    )
    assert resolved.warnings == (
        "secret OPENAI_API_KEY is only 1 character long, so it is redacted only where it "
        "stands alone as a word, not inside longer words",
        "secret PIN is only 6 characters long, so it is redacted only where it "
        "stands alone as a word, not inside longer words",
    )
    assert "7Zq9Pw" not in repr(resolved) and "sk-judge" not in repr(resolved)
    assert short_secret_warnings({"LONG": "12345678", "EMPTY": ""}) == []
