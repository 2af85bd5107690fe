"""The words every part of osmosis shares, each defined once: statuses, the pass rule, sizes.

The engine, the platform (its tables, routes and dashboard), the wire schemas and the command
line all import these; none defines its own (`tests/unit/test_vocabulary.py` greps for a second
definition). Standard library only, so anything but the SDK (`osmosis.rollout`) may import it.

    passes(0.8, threshold=0.5)        # True: a graded attempt passes when reward >= threshold
    outcome("success", 0.0, 1.0)      # 'not_passed': graded below the threshold
    format_bytes(3 * 1024**2)         # '3.0 MiB'
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final, Literal, Protocol, TypeVar, get_args

#: How an attempt ended: graded or not (`success`), crashed or timed out (`failed`, with an
#: error type), or removed by its grader (`skipped`).
AttemptStatus = Literal["success", "failed", "skipped"]
ATTEMPT_STATUSES: Final[tuple[AttemptStatus, ...]] = get_args(AttemptStatus)

#: What an attempt came to, the one set of words every surface counts and filters by:
#: `passed` (graded at or above the pass threshold), `not_passed` (graded below it, or not
#: graded), `errored` (status `failed`: a timeout, an agent error, ...) or `skipped`.
Outcome = Literal["passed", "not_passed", "errored", "skipped"]
OUTCOMES: Final[tuple[Outcome, ...]] = get_args(Outcome)
#: Each outcome as people read it (badges, summaries, filters).
OUTCOME_LABELS: Final[dict[Outcome, str]] = {
    "passed": "passed",
    "not_passed": "not passed",
    "errored": "errored",
    "skipped": "skipped",
}

#: Where a platform run is in its life. `halted`: the engine stopped dispatching because the
#: run's budget is spent (its `error` says which limit); nothing failed, a retry resumes it.
RunStatus = Literal["pending", "running", "finished", "failed", "stopped", "halted"]
RUN_STATUSES: Final[tuple[RunStatus, ...]] = get_args(RunStatus)
#: The run statuses a platform run never leaves by itself (a retry queues it again).
TERMINAL_RUN_STATUSES: Final[tuple[RunStatus, ...]] = ("finished", "failed", "stopped", "halted")

#: Where a run directory (`osmosis eval run`) stands: `running` while a process holds its
#: lock, else what its `metrics.json` says: `finished` (every attempt recorded) or
#: `incomplete` (run it again to resume).
LocalRunStatus = Literal["running", "finished", "incomplete"]
LOCAL_RUN_STATUSES: Final[tuple[LocalRunStatus, ...]] = get_args(LocalRunStatus)

#: The pass threshold of a run whose config names none.
DEFAULT_PASS_THRESHOLD: Final = 1.0

#: The largest page any list route serves, and the client asks for.
MAX_PAGE: Final = 50

_BINARY_UNITS: Final = ("B", "KiB", "MiB", "GiB")

_Verdict = TypeVar("_Verdict", covariant=True)


class _Reward(Protocol[_Verdict]):
    def __ge__(self, threshold: float, /) -> _Verdict: ...


def pass_clause(reward: _Reward[_Verdict], threshold: float) -> _Verdict:
    """The pass rule's one comparison, for a reward that is a number or an SQL column.

    A column gives an SQL condition, in which a NULL reward (not graded) is never true, so SQL
    needs no separate `IS NOT NULL`; in Python, `passes` adds that for `None`.

        pass_clause(0.8, 0.5)                        # True
        select(...).where(pass_clause(EvalAttempt.reward, 1.0))  # reward >= 1.0
    """
    return reward >= threshold


def passes(reward: float | None, threshold: float) -> bool:
    """The pass rule: a graded attempt passes when its reward reaches the threshold.

    passes(1.0, 1.0)   # True
    passes(None, 0.0)  # False: an attempt without a reward never passes
    """
    return reward is not None and pass_clause(reward, threshold)


def outcome(status: str, reward: float | None, threshold: float) -> Outcome:
    """What an attempt came to, from its status, its reward and the run's pass threshold.

    A failed attempt is `errored` even when it carries a reward (an imported run may).

        outcome("success", 0.0, threshold=1.0)  # 'not_passed'
        outcome("failed", None, threshold=1.0)  # 'errored'
    """
    if status == "failed":
        return "errored"
    if status == "skipped":
        return "skipped"
    return "passed" if passes(reward, threshold) else "not_passed"


def count_outcomes(
    attempts: Iterable[tuple[str, float | None]], threshold: float
) -> dict[Outcome, int]:
    """How many `(status, reward)` attempts came to each outcome, every outcome present.

    count_outcomes([("success", 1.0), ("failed", None)], threshold=1.0)
    # {'passed': 1, 'not_passed': 0, 'errored': 1, 'skipped': 0}
    """
    counts = dict.fromkeys(OUTCOMES, 0)
    for status, reward in attempts:
        counts[outcome(status, reward, threshold)] += 1
    return counts


def outcomes_of_counts(
    *, completed: int, passed: int, failed: int, skipped: int
) -> dict[Outcome, int]:
    """The four outcomes from a summary's older counts, for a run whose record has no
    `outcomes`: `failed` attempts errored, and the rest not passed or skipped did not pass.

        outcomes_of_counts(completed=6, passed=3, failed=2, skipped=0)
        # {'passed': 3, 'not_passed': 1, 'errored': 2, 'skipped': 0}
    """
    return {
        "passed": passed,
        "not_passed": max(completed - skipped - failed - passed, 0),
        "errored": failed,
        "skipped": skipped,
    }


def describe_outcomes(counts: Mapping[Outcome, int] | Mapping[str, int], *, sep: str = ", ") -> str:
    """The four outcome counts as people read them, in the vocabulary's order.

    describe_outcomes({"passed": 3, "not_passed": 1, "errored": 2})
    # '3 passed, 1 not passed, 2 errored, 0 skipped'
    """
    return sep.join(f"{counts.get(name, 0)} {OUTCOME_LABELS[name]}" for name in OUTCOMES)


def format_bytes(count: int, *, exact: bool = False) -> str:
    """A byte count for people in binary units, as the download layout counts: `4.2 KiB`.

    `exact=True` states a configured size (a limit) as a whole number of the largest unit
    that divides it, and one that no unit divides in bytes, as limits have always been shown.

        format_bytes(4300)                      # '4.2 KiB'
        format_bytes(2 * 1024**3, exact=True)   # '2 GiB'; 1500 gives '1500 bytes'
    """
    if exact:
        for power in range(len(_BINARY_UNITS) - 1, 0, -1):
            size = 1024**power
            if count >= size and count % size == 0:
                return f"{count // size} {_BINARY_UNITS[power]}"
        return f"{count} bytes"
    value = float(count)
    for unit in _BINARY_UNITS:
        if value < 1024 or unit == _BINARY_UNITS[-1]:
            return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # the loop returns at its last unit


def format_rate(value: float, *, digits: int = 1) -> str:
    """A rate (pass rate, pass@k, pass^k, an interval's ends) as every surface shows it: a
    percent, so a rate and its interval read in one unit.

        format_rate(0.4791)  # '47.9%'
    """
    return f"{value:.{digits}%}"


__all__ = [
    "ATTEMPT_STATUSES",
    "DEFAULT_PASS_THRESHOLD",
    "LOCAL_RUN_STATUSES",
    "MAX_PAGE",
    "OUTCOMES",
    "OUTCOME_LABELS",
    "RUN_STATUSES",
    "TERMINAL_RUN_STATUSES",
    "AttemptStatus",
    "LocalRunStatus",
    "Outcome",
    "RunStatus",
    "count_outcomes",
    "describe_outcomes",
    "format_bytes",
    "format_rate",
    "outcome",
    "outcomes_of_counts",
    "pass_clause",
    "passes",
]
