"""Live progress of `eval run`: stage lines and a bar with pass rate, outcomes, tokens, rate.

In a terminal the bar redraws in place. Without one (a CI log, a pipe, `--plain`) a line is
printed instead each time another 10 % of the work is done (at most one a second) and at
least every `line_interval_s` seconds while attempts finish, so a long run is never silent;
`--json` prints nothing until its envelope.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from osmosis.cli.output import Mode, Output
from osmosis.vocabulary import (
    DEFAULT_PASS_THRESHOLD,
    OUTCOMES,
    Outcome,
    describe_outcomes,
    outcome,
    passes,
)

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from osmosis.eval.results.records import AttemptRecord


class EvalProgress:
    """Implements the engine host's `Reporter` for the terminal."""

    def __init__(
        self, out: Output, *, verbose: bool = False, line_interval_s: float = 10.0
    ) -> None:
        self.out = out
        self.verbose = verbose
        self.line_interval_s = line_interval_s
        self.total = 0
        self.done = 0
        self.passed = 0
        self.scored = 0
        self.failed = 0
        self.outcomes: dict[Outcome, int] = dict.fromkeys(OUTCOMES, 0)
        self.tokens = 0
        self.threshold = DEFAULT_PASS_THRESHOLD
        self._started = time.monotonic()
        self._session_done = 0
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._lines = False  # print progress lines (no terminal to draw a bar on)
        self._last_line = 0.0
        self._last_step = 0

    def stage(self, message: str) -> None:
        self._print(message if message.startswith("→") else f"→ {message}")

    def log_line(self, line: str) -> None:
        if self.verbose:
            self._print(line)

    def start_progress(self, total: int, done: int, *, pass_threshold: float) -> None:
        self.total, self.done = total, done
        self.threshold = pass_threshold
        self._started = time.monotonic()
        if self.out.mode is Mode.JSON:
            return
        if self.out.mode is Mode.PLAIN or not self.out.console.is_terminal:
            self._lines = True
            self._last_line = self._started
            self._last_step = self._step()
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self._progress = Progress(
            TextColumn("[bold]eval"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[summary]}"),
            console=self.out.console,
            transient=False,
        )
        self._progress.start()
        self._task = self._progress.add_task("eval", total=total, completed=done, summary="")

    def advance(self, record: AttemptRecord) -> None:
        self.done += 1
        self._session_done += 1
        self.tokens += record.tokens or 0
        if record.status == "failed":
            self.failed += 1
        self.outcomes[outcome(record.status, record.reward, self.threshold)] += 1
        if record.status != "skipped":
            self.scored += 1
            if passes(record.reward, self.threshold):
                self.passed += 1
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=self.done, summary=self.summary())
        elif self._lines:
            now = time.monotonic()
            step = self._step()
            stepped = step > self._last_step and now - self._last_line >= 1.0
            if stepped or now - self._last_line >= self.line_interval_s or self.done == self.total:
                self._last_line, self._last_step = now, step
                share = f" ({self.done / self.total:.0%})" if self.total else ""
                self._print(f"eval {self.done}/{self.total}{share} · {self.summary()}")

    def _step(self) -> int:
        """Which tenth of the work is done."""
        return self.done * 10 // self.total if self.total else 0

    def summary(self) -> str:
        elapsed = max(time.monotonic() - self._started, 1e-9)
        pass_rate = self.passed / self.scored if self.scored else 0.0
        outcomes = describe_outcomes(self.outcomes, sep=" · ")
        from osmosis.eval.model.bridge_limits import traffic  # imported by the run already

        return (
            f"pass {pass_rate:.0%} · {outcomes} · tokens {self.tokens:,} · "
            f"{self._session_done / elapsed:.1f}/s{traffic()}"
        )

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def _print(self, line: str) -> None:
        if self._progress is not None:
            self._progress.console.print(line, markup=False, highlight=False)
        else:
            self.out.info(line)
