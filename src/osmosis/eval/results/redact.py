"""Hide secret values in text and JSON-like data before it is logged or stored.

    redactor = Redactor(["sk-live-123", "hunter2"])
    redactor.redact("key=sk-live-123")  # 'key=[REDACTED]'

The run log, events, trajectories and error messages all pass through one `Redactor`, so a
value injected into a rollout never comes back out of the engine in clear text.

Short values: a value of at least 8 characters is hidden wherever it occurs. A shorter one is
hidden only as a whole token, never inside a longer word: with `OPENAI_API_KEY=x`, the text
`key x rejected` becomes `key [REDACTED] rejected` while `row_index` stays `row_index`.
"Inside a word" means a word character (a letter, a digit or `_`) touches a side of the value
that is itself a word character. Hiding every `x` would mangle every text it touches and,
in a JSON document, its keys; a value that short protects little anyway, so
`osmosis.eval.inputs.secrets` warns by name about such secrets. Structured documents are redacted
as data (`redact_obj`: strings only, keys included), never as their serialized text, so their
structure survives whatever the secrets are.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

PLACEHOLDER = "[REDACTED]"
SHORT_SECRET_LENGTH = 8
"""Values shorter than this are hidden only as whole tokens (see the module doc)."""

# The run log also hides env values that look like credentials (reference §11): a name with
# one of these words and a value long enough not to be a flag such as "1" or "true".
_SENSITIVE_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)
_SENSITIVE_MIN_LENGTH = SHORT_SECRET_LENGTH

_WORD = re.compile(r"\w")

T = TypeVar("T")


class Redactor:
    """Replace every occurrence of any secret value with `[REDACTED]`.

    redactor = Redactor(["abcdef-123", "123-ghijkl"])
    redactor.redact("xabcdef-123-ghijkly")  # 'x[REDACTED]y'

    Every non-blank value is hidden, however short, but a value shorter than
    `SHORT_SECRET_LENGTH` only as a whole token (`Redactor(["x"]).redact("row_index x")` is
    `'row_index [REDACTED]'`; see the module doc). Empty and whitespace-only values are
    ignored, because hiding every space would destroy the text and protect nothing.
    Overlapping occurrences are merged, so no fragment of either secret survives, and a value
    is also hidden in its JSON-escaped spelling (a secret holding a quote or a backslash is
    written that way in a dumped document).
    """

    def __init__(self, secrets: Iterable[str] = (), *, placeholder: str = PLACEHOLDER) -> None:
        values = {value for value in secrets if value and not value.isspace()}
        # Each spelling with the value it spells: the whole-token rule goes by the value's
        # length, whatever its escaped spelling's.
        variants: dict[str, bool] = {}
        for value in values:
            short = len(value) < SHORT_SECRET_LENGTH
            for spelling in (
                value,
                json.dumps(value, ensure_ascii=False)[1:-1],
                json.dumps(value)[1:-1],
            ):
                variants[spelling] = variants.get(spelling, True) and short
        self._secrets = frozenset(values)
        self.placeholder = placeholder
        # Longest first: at a position where several secrets start, the alternation takes the
        # longest, and a zero-width lookahead reports every start position, overlaps included.
        ordered = sorted(variants, key=lambda value: (-len(value), value))
        alternation = "|".join(_pattern(value, whole_token=variants[value]) for value in ordered)
        self._any = re.compile(alternation) if ordered else None
        self._starts = re.compile(f"(?=({alternation}))") if ordered else None
        # Every spelling as a JSON document's text shows it: a string holding a spelling is
        # escaped code point by code point, so its text holds the spelling escaped (either
        # way: encoders differ on non-ASCII). No whole-token rule: it does not survive the
        # escaping (`\nab`), and a needless walk costs only time.
        in_json = {
            json.dumps(spelling, ensure_ascii=ascii_only)[1:-1]
            for spelling in variants
            for ascii_only in (True, False)
        }
        self._in_json = (
            re.compile("|".join(re.escape(text) for text in sorted(in_json, key=len, reverse=True)))
            if in_json
            else None
        )

    @property
    def secrets(self) -> frozenset[str]:
        """The values this redactor hides (not their escaped variants)."""
        return self._secrets

    @property
    def short_secrets(self) -> frozenset[str]:
        """The values hidden only as whole tokens (shorter than `SHORT_SECRET_LENGTH`)."""
        return frozenset(value for value in self._secrets if len(value) < SHORT_SECRET_LENGTH)

    def __bool__(self) -> bool:
        return bool(self._secrets)

    def __repr__(self) -> str:
        return f"Redactor(<{len(self._secrets)} secrets>)"  # never the values themselves

    def extend(self, secrets: Iterable[str]) -> Redactor:
        """A new redactor hiding these values as well as the current ones.

        redactor = Redactor(["a-secret"]).extend(["bridge-token"])
        """
        return Redactor([*self._secrets, *secrets], placeholder=self.placeholder)

    def redact(self, text: str) -> str:
        """`text` with every secret occurrence replaced by the placeholder.

        Redactor(["hunter2"]).redact("pw: hunter2")  # 'pw: [REDACTED]'
        """
        if self._any is None or self._starts is None or self._any.search(text) is None:
            return text  # the common case: one scan, no copy
        spans: list[tuple[int, int]] = []
        for match in self._starts.finditer(text):
            start, end = match.start(), match.start() + len(match.group(1))
            if spans and start <= spans[-1][1]:
                spans[-1] = (spans[-1][0], max(spans[-1][1], end))
            else:
                spans.append((start, end))
        pieces: list[str] = []
        cursor = 0
        for start, end in spans:
            pieces.append(text[cursor:start])
            pieces.append(self.placeholder)
            cursor = end
        pieces.append(text[cursor:])
        return "".join(pieces)

    def clean_json(self, text: str) -> bool:
        """True when the JSON `text` of a document shows that none of its strings (keys
        included) holds a secret, in any spelling `redact` hides: one scan of the text
        instead of a walk over every string. False may be wrong (a spelling across two
        strings, say); True never is.

        Redactor(['pa"ss-1234']).clean_json(json.dumps({"log": '{"pw": "pa\\"ss-1234"}'}))
        # False: the secret's escaped spelling, escaped once more by the document
        """
        return self._in_json is None or self._in_json.search(text) is None

    def redact_obj(self, obj: T) -> T:
        """A JSON-like structure with every string (keys included) redacted.

        Redactor(["tok-1234"]).redact_obj({"auth": "Bearer tok-1234", "n": 3})
        # {'auth': 'Bearer [REDACTED]', 'n': 3}

        With a secret in it, dicts, lists and tuples are rebuilt; numbers, booleans, None and
        other objects are returned as they are. With none (`clean_json` of its JSON text, a
        fraction of a walk's time), `obj` itself comes back.
        """
        if not self._secrets:
            return obj
        try:
            text = json.dumps(obj, default=str)
        except (TypeError, ValueError, RecursionError):  # keys JSON cannot write: walk it
            return self._walk(obj)  # type: ignore[no-any-return]
        return obj if self.clean_json(text) else self._walk(obj)

    def _walk(self, obj: Any) -> Any:
        if not self._secrets:
            return obj
        if isinstance(obj, str):
            return self.redact(obj)
        if isinstance(obj, Mapping):
            return {self._walk(key): self._walk(value) for key, value in obj.items()}
        if isinstance(obj, list):
            return [self._walk(item) for item in obj]
        if isinstance(obj, tuple):
            return tuple(self._walk(item) for item in obj)
        return obj


def _pattern(value: str, *, whole_token: bool) -> str:
    """`value` as a literal pattern; a whole-token one may not touch a word character on a
    side where the value itself ends in one."""
    pattern = re.escape(value)
    if whole_token:
        if _WORD.match(value[0]):
            pattern = r"(?<!\w)" + pattern
        if _WORD.match(value[-1]):
            pattern += r"(?!\w)"
    return pattern


def sensitive_env_values(env: Mapping[str, str]) -> list[str]:
    """Values of `env` that look like credentials: the name says KEY, TOKEN, SECRET or
    PASSWORD and the value has at least 8 characters.

    sensitive_env_values({"API_KEY": "sk-12345678", "DEBUG": "1"})  # ['sk-12345678']
    """
    return [
        value
        for name, value in env.items()
        if _SENSITIVE_NAME.search(name) and len(value) >= _SENSITIVE_MIN_LENGTH
    ]


__all__ = ["PLACEHOLDER", "SHORT_SECRET_LENGTH", "Redactor", "sensitive_env_values"]
