"""Redactor: every secret occurrence becomes [REDACTED], in text and in JSON-like data."""

import json

import pytest

from osmosis.eval.redact import PLACEHOLDER, Redactor, sensitive_env_values


@pytest.mark.parametrize(
    ("secrets", "text", "expected"),
    [
        (["sk-live-123"], "key=sk-live-123", "key=[REDACTED]"),
        (["sk-live-123"], "sk-live-123 and sk-live-123", "[REDACTED] and [REDACTED]"),
        (["sk-live-123"], "nothing to hide", "nothing to hide"),
        (["abc"], "short abc too", "short [REDACTED] too"),  # short values are still secrets
        (["x"], "max", "ma[REDACTED]"),
        # overlapping secrets: no fragment of either survives
        (["abcdef", "defghi"], "xabcdefghiy", "x[REDACTED]y"),
        (["token", "token-extended"], "token-extended!", "[REDACTED]!"),  # longest first
        (["token", "token-extended"], "token-ext", "[REDACTED]-ext"),
        (["aaa"], "aaaa", "[REDACTED]"),  # overlapping occurrences of one secret
        (["a.b*c"], "a.b*c axbbc", "[REDACTED] axbbc"),  # values are literal, not patterns
        ([], "anything", "anything"),
        (["", "   ", "\n"], "a   b\n", "a   b\n"),  # blank values are ignored, not "redacted"
    ],
)
def test_redact_hides_every_occurrence(secrets, text, expected):
    assert Redactor(secrets).redact(text) == expected


def test_a_secret_is_also_hidden_in_its_json_escaped_form():
    secret = 'pa"ss\\word'
    dumped = json.dumps({"password": secret})
    assert Redactor([secret]).redact(dumped) == '{"password": "[REDACTED]"}'


def test_redact_obj_rebuilds_json_like_structures():
    redactor = Redactor(["tok-1234"])
    document = {
        "auth": "Bearer tok-1234",
        "tok-1234": [1, 2.5, None, True, ("tok-1234", "ok")],
        "nested": {"list": ["x tok-1234 y"]},
    }
    assert redactor.redact_obj(document) == {
        "auth": "Bearer [REDACTED]",
        "[REDACTED]": [1, 2.5, None, True, ("[REDACTED]", "ok")],
        "nested": {"list": ["x [REDACTED] y"]},
    }
    assert document["auth"] == "Bearer tok-1234"  # the input is left untouched


def test_an_empty_redactor_is_falsy_and_a_no_op():
    redactor = Redactor([])
    document = {"a": ["b"]}
    assert not redactor
    assert redactor.redact_obj(document) is document


def test_extend_adds_secrets_and_repr_never_shows_them():
    redactor = Redactor(["first-secret"]).extend(["bridge-token"])
    assert redactor.secrets == {"first-secret", "bridge-token"}
    assert redactor.redact("first-secret bridge-token") == f"{PLACEHOLDER} {PLACEHOLDER}"
    assert "secret" not in repr(redactor).replace("secrets", "")


def test_a_custom_placeholder():
    assert Redactor(["hunter2"], placeholder="***").redact("pw hunter2") == "pw ***"


def test_sensitive_env_values_picks_credential_like_names_with_long_values():
    env = {
        "OPENAI_API_KEY": "sk-12345678",
        "GITHUB_TOKEN": "ghp_abcdefgh",
        "DB_PASSWORD": "short",  # under 8 characters: too likely to be a flag
        "CLIENT_SECRET": "s" * 8,
        "DEBUG": "a-long-but-harmless-value",
    }
    assert sensitive_env_values(env) == ["sk-12345678", "ghp_abcdefgh", "ssssssss"]
