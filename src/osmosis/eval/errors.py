"""Why a run cannot start or go on, in the same words for every host.

    try:
        report = await run_evaluation(plan, reporter)
    except HostError as error:
        print(error.code, error, error.hint)   # the CLI: exit 1 with this; the worker: failed

A host error is the user's to fix (an environment that does not build, an entrypoint that
raises at import, a run name in use, changed inputs), never a bug of osmosis: `eval run`
prints the message and the hint and exits 1 with `code`; the platform worker marks the run
`failed` with `describe(error)`. Each kind lives beside the code that raises it
(`RolloutEnvironmentError`, `RolloutStartError`, `RunLocked`, `ResumeRefused`, `RunFailed`).
"""

from __future__ import annotations

from typing import ClassVar


class HostError(Exception):
    """A run that cannot start or go on. `code` is one of the reference's CLI error codes."""

    code: str = "VALIDATION"
    default_hint: ClassVar[str] = ""

    def __init__(self, message: str, *, hint: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.hint = self.default_hint if hint is None else hint
        if code is not None:
            self.code = code


def describe(error: BaseException) -> str:
    """The message and, when there is one, the hint: `... (nothing was dispatched)`."""
    text = str(error) or type(error).__name__
    hint = getattr(error, "hint", "")
    return f"{text} ({hint})" if hint else text


__all__ = ["HostError", "describe"]
