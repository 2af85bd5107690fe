"""Deterministic wrong answers and injected errors, decided by hashing rather than by chance.

Reproducible failures make flaky-looking tests impossible: the same seed gives the same
faults on every run, on every machine, whatever the order in which requests arrive.

- Wrong answers are decided per prompt (the last user message): with a given seed, a prompt is
  always answered right or always answered wrong, and always with the same wrong number.
- Errors are decided per (seed, conversation, attempt): the n-th time the same messages are
  sent, the outcome is fixed. A retry is a new attempt, so a client that retries usually gets
  through, which is how a real provider's transient 429s and 500s behave; how many attempts a
  conversation needs is still reproducible. (Keyed on the prompt alone, a failing prompt would
  fail forever; keyed on a global request count, concurrency would reshuffle which one fails.)

    faults = Faults(wrong_rate=0.5, error_rate=0.0, seed=7)
    faults.is_wrong("What is 2 + 2?")  # the same answer on every call
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any


def unit_interval(seed: int, *parts: str) -> float:
    """A number in [0, 1) that depends only on `seed` and `parts` (stable across processes)."""
    key = "\0".join((str(seed), *parts)).encode("utf-8", "surrogatepass")
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


class Faults:
    """Decides which answers are wrong and which requests fail, reproducibly for a seed."""

    def __init__(self, *, wrong_rate: float, error_rate: float, seed: int) -> None:
        self.wrong_rate = wrong_rate
        self.error_rate = error_rate
        self.seed = seed
        # Attempts per conversation digest; only the event loop's thread touches it.
        self._attempts: dict[bytes, int] = {}

    def is_wrong(self, prompt: str) -> bool:
        """Whether the answer to `prompt` is deliberately wrong."""
        return self.wrong_rate > 0 and unit_interval(self.seed, "wrong", prompt) < self.wrong_rate

    def wrong_offset(self, prompt: str) -> int:
        """The non-zero amount added to a wrong answer: ±1..9, fixed per prompt."""
        draw = unit_interval(self.seed, "offset", prompt)
        magnitude = 1 + int(draw * 18) % 9
        return magnitude if draw < 0.5 else -magnitude

    def should_fail(self, messages: Sequence[Any]) -> bool:
        """Whether this attempt at `messages` gets an injected error (counts the attempt)."""
        if self.error_rate <= 0:
            return False
        canonical = json.dumps(messages, sort_keys=True, separators=(",", ":"), default=str)
        digest = hashlib.blake2b(
            canonical.encode("utf-8", "surrogatepass"), digest_size=16
        ).digest()
        attempt = self._attempts.get(digest, 0)
        self._attempts[digest] = attempt + 1
        return unit_interval(self.seed, "error", digest.hex(), str(attempt)) < self.error_rate

    def reset(self) -> None:
        """Forget attempt counts, so the error sequence starts again."""
        self._attempts = {}
