"""Redactor: every secret occurrence becomes [REDACTED], in text and in JSON-like data; values
under 8 characters only as whole tokens."""

import json
from datetime import UTC, datetime

import pytest

from osmosis.eval.results.records import AttemptRecord
from osmosis.eval.results.redact import (
    PLACEHOLDER,
    SHORT_SECRET_LENGTH,
    Redactor,
    sensitive_env_values,
)
from osmosis.rollout.jsonbytes import dumps


@pytest.mark.parametrize(
    ("secrets", "text", "expected"),
    [
        (["sk-live-123"], "key=sk-live-123", "key=[REDACTED]"),
        (["sk-live-123"], "sk-live-123 and sk-live-123", "[REDACTED] and [REDACTED]"),
        (["sk-live-123"], "nothing to hide", "nothing to hide"),
        (["sk-live-123"], "xsk-live-123y", "x[REDACTED]y"),  # 8+ characters: hidden anywhere
        # overlapping secrets: no fragment of either survives
        (["abcdef-123", "123-ghijkl"], "xabcdef-123-ghijkly", "x[REDACTED]y"),
        (["token", "token-extended"], "token-extended!", "[REDACTED]!"),  # longest first
        (["token", "token-extended"], "token-ext", "[REDACTED]-ext"),
        (["aaaaaaaa"], "aaaaaaaaaa", "[REDACTED]"),  # overlapping occurrences of one secret
        (["a.b*c"], "a.b*c axbbc", "[REDACTED] axbbc"),  # values are literal, not patterns
        ([], "anything", "anything"),
        (["", "   ", "\n"], "a   b\n", "a   b\n"),  # blank values are ignored, not "redacted"
        # Under 8 characters: still a secret, but hidden only as a whole token.
        (["abc"], "short abc too", "short [REDACTED] too"),
        (["x"], "x", "[REDACTED]"),
        (["x"], "key x rejected", "key [REDACTED] rejected"),
        (["x"], "row_index max x_y x1 1x", "row_index max x_y x1 1x"),  # inside words: kept
        (["x"], "(x) 'x', x.", "([REDACTED]) '[REDACTED]', [REDACTED]."),
        (["hunter2"], "pw=hunter2; hunter22 ahunter2", "pw=[REDACTED]; hunter22 ahunter2"),
        (["!!"], "a!!b", "a[REDACTED]b"),  # no word character at its edges: no boundary to keep
        (["-ab"], "x-ab -abc", "x[REDACTED] -abc"),  # only its word-character edge is checked
    ],
)
def test_redact_hides_every_occurrence(secrets, text, expected):
    assert Redactor(secrets).redact(text) == expected


@pytest.mark.parametrize("secret", ['pa"ss\\word', 'a"b'])  # long and short
def test_a_secret_is_also_hidden_in_its_json_escaped_form(secret):
    dumped = json.dumps({"password": secret})
    assert Redactor([secret]).redact(dumped) == '{"password": "[REDACTED]"}'


def test_a_one_letter_secret_leaves_a_journal_line_readable():
    # OPENAI_API_KEY=x once turned "row_index" into "row_inde[REDACTED]" in every journal
    # line, and the run ended with a ValidationError after every attempt had run.
    record = AttemptRecord(
        row_index=3,
        run_index=0,
        rollout_id="0f" * 16,
        source_row_index=17,
        status="failed",
        error_type="agent_error",
        error_message="provider said: key x rejected",
        duration_ms=12.5,
        finished_at=datetime(2026, 12, 1, tzinfo=UTC),
    )
    line = record.model_dump_json()
    redactor = Redactor(["x"])

    as_text = AttemptRecord.model_validate_json(redactor.redact(line))
    as_data = AttemptRecord.model_validate(redactor.redact_obj(record.model_dump(mode="json")))
    for redacted in (as_text, as_data):
        assert redacted.error_message == "provider said: key [REDACTED] rejected"
        assert redacted.model_dump(exclude={"error_message"}) == record.model_dump(
            exclude={"error_message"}
        )


def test_data_redaction_keeps_numbers_whatever_the_secret():
    # A secret "1" as text would turn `"row_index": 1` into `"row_index": [REDACTED]`:
    # documents are redacted as data, where only strings change.
    redactor = Redactor(["1"])
    assert redactor.redact('{"row_index": 1}') == '{"row_index": [REDACTED]}'
    assert redactor.redact_obj({"row_index": 1, "note": "1 apple, 11 pears"}) == {
        "row_index": 1,
        "note": "[REDACTED] apple, 11 pears",
    }


def test_short_secrets_lists_the_values_hidden_only_as_whole_tokens():
    redactor = Redactor(["x", "hunter2", "sk-live-123", " "])
    assert redactor.short_secrets == {"x", "hunter2"}
    assert redactor.secrets == {"x", "hunter2", "sk-live-123"}
    assert len("hunter2") == SHORT_SECRET_LENGTH - 1


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


# Secrets JSON escapes (a quote, a backslash, a newline, non-ASCII, beyond the BMP), long and
# short, each in a document three ways: as itself, in its JSON-escaped spelling (a string that
# holds a JSON dump of the environment), and as a key.
TRICKY_SECRETS = [
    'pa"ss\\word-1',
    "line\nbreak-12",
    "caf\u00e9-s3cret",
    "k\U0001f511-secret",
    'a"b',
    "ab",
]


def holding(secret: str) -> list[object]:
    escaped = json.dumps(secret)[1:-1]
    return [
        {"steps": [{"message": f"the key: {secret}."}]},
        {"log": "env: " + json.dumps({"PW": secret}), "n": 1},
        {"log": "env: " + json.dumps({"PW": secret}, ensure_ascii=False)},
        {"notes": [f"quoted {escaped} here"]},
        {secret: [1, 2.5, None, True]},
    ]


@pytest.mark.parametrize("secret", TRICKY_SECRETS)
@pytest.mark.parametrize("encode", [json.dumps, lambda doc: dumps(doc).decode()])
def test_the_json_text_of_a_document_never_looks_clean_when_a_string_holds_a_secret(secret, encode):
    """`clean_json` lets writers skip the walk over every string; a document whose trajectory
    held a quote-bearing secret in its escaped spelling once passed it, and was written with
    the secret in it."""
    redactor = Redactor([secret])
    spellings = {secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1]}
    for document in holding(secret):
        assert not redactor.clean_json(encode(document)), document
        redacted = json.dumps(redactor.redact_obj(document), ensure_ascii=False)
        assert PLACEHOLDER in redacted
        assert not [s for s in spellings if len(s) >= SHORT_SECRET_LENGTH and s in redacted]


def test_a_document_without_a_secret_comes_back_as_it_is():
    redactor = Redactor(["sk-live-0123456789", "x"])
    document = {"steps": [{"message": "nothing here", "tokens": 12}], "keys": ("a", "b")}
    assert redactor.clean_json(json.dumps(document))
    assert redactor.redact_obj(document) is document
    odd = {("a", "tuple"): "sk-live-0123456789"}  # a key JSON cannot write: walked instead
    assert redactor.redact_obj(odd) == {("a", "tuple"): PLACEHOLDER}


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
