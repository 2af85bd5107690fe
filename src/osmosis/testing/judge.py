"""A judge mode for the scripted model: configurable verdicts for LLM-as-judge prompts.

`JudgeScript` answers the prompts `osmosis eval rubric` sends, chosen by the candidate text
inside the prompt's `CANDIDATE_OUTPUT` fence: a score (sent as `{"score", "explanation"}`),
a raw string (malformed JSON, a missing key, an out-of-range score), a `Fail` (an HTTP error),
or a list of these given in turn to successive calls for that candidate (the last repeats).

    judge = JudgeScript({"Paris": 1.0, "London": "not json", "Rome": Fail(503)}, default=0.5)
    with FakeModelServer(script=judge.rules()) as server:
        ...  # osmosis eval rubric --model openai/judge with OPENAI_API_BASE=server.base_url
    judge.candidates  # every candidate judged, in arrival order

With `schema=False` it refuses `response_format` JSON schemas with HTTP 400, as providers
without structured outputs do, and answers JSON-mode requests normally.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import TypeAlias

from osmosis.testing.script import ChatRequest, Fail, Reply, Rule

__all__ = ["JudgeAnswer", "JudgeScript", "candidate_text"]

JudgeAnswer: TypeAlias = float | int | str | Fail | Reply
"""A number (a well-formed verdict with that score), a raw reply text, an error, or a reply."""

_CANDIDATE = re.compile(
    r"<<<BEGIN_CANDIDATE_OUTPUT_(?P<nonce>[0-9A-Za-z]+)>>>\n(?P<text>.*?)\n"
    r"<<<END_CANDIDATE_OUTPUT_(?P=nonce)>>>",
    re.DOTALL,
)


def candidate_text(request: ChatRequest) -> str | None:
    """The candidate inside a judge prompt's fence, or None when the request is no judge
    prompt.

    candidate_text(server.requests[-1])  # "Paris"
    """
    match = _CANDIDATE.search(request.text)
    return match.group("text") if match else None


class JudgeScript:
    """Verdicts for judge prompts, chosen by a substring of the candidate (first key wins).

    JudgeScript({"correct": 1.0, "wrong": [0.0, 0.2]}, default=0.5).rules()
    """

    def __init__(
        self,
        verdicts: Mapping[str, JudgeAnswer | Sequence[JudgeAnswer]] | None = None,
        *,
        default: JudgeAnswer | Sequence[JudgeAnswer] = 1.0,
        schema: bool = True,
        explanation: str = "scripted verdict",
    ) -> None:
        self._verdicts = dict(verdicts or {})
        self._default = default
        self._schema = schema
        self._explanation = explanation
        self._calls: dict[str, int] = {}
        self.candidates: list[str] = []
        """Every candidate text judged (errors included), in arrival order."""

    def rules(self) -> list[Rule]:
        """The rules to pass as `FakeModelServer(script=...)` (or to `add_rule`)."""
        return [Rule(when=lambda request: candidate_text(request) is not None, respond=self)]

    def __call__(self, request: ChatRequest) -> Reply | Fail | None:
        candidate = candidate_text(request)
        if candidate is None:
            return None
        response_format = request.body.get("response_format")
        if (
            not self._schema
            and isinstance(response_format, Mapping)
            and response_format.get("type") == "json_schema"
        ):
            return Fail(400, "response_format json_schema is not supported by this model")
        self.candidates.append(candidate)
        # Successive calls for the same candidate take successive answers of a list.
        count = self._calls.get(candidate, 0)
        self._calls[candidate] = count + 1
        return self._reply(self._choose(candidate), count)

    def _choose(self, candidate: str) -> JudgeAnswer | Sequence[JudgeAnswer]:
        for key, answer in self._verdicts.items():
            if key in candidate:
                return answer
        return self._default

    def _reply(self, answer: JudgeAnswer | Sequence[JudgeAnswer], count: int) -> Reply | Fail:
        if isinstance(answer, Sequence) and not isinstance(answer, str):
            answer = answer[min(count, len(answer) - 1)]
        if isinstance(answer, (Fail, Reply)):
            return answer
        if isinstance(answer, str):
            return Reply(answer)
        return Reply(json.dumps({"score": answer, "explanation": self._explanation}))
