"""Live progress of `eval run`: stage lines and a bar with pass rate, failures, tokens, rate."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from osmosis.cli.output import Mode, Output

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from osmosis.eval.records import AttemptRecord


class EvalProgress:
    """Implements the engine host's `Reporter` for the terminal."""

    def __init__(self, out: Output, *, verbose: bool = False) -> None:
        self.out = out
        self.verbose = verbose
        self.total = 0
        self.done = 0
        self.passed = 0
        self.scored = 0
        self.failed = 0
        self.tokens = 0
        self.threshold = 1.0
        self._started = time.monotonic()
        self._session_done = 0
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def stage(self, message: str) -> None:
        self._print(message if message.startswith("→") else f"→ {message}")

    def log_line(self, line: str) -> None:
        if self.verbose:
            self._print(line)

    def start_progress(self, total: int, done: int, *, pass_threshold: float) -> None:
        self.total, self.done = total, done
        self.threshold = pass_threshold
        self._started = time.monotonic()
        if self.out.mode is not Mode.RICH or not self.out.console.is_terminal:
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
        if record.status != "skipped":
            self.scored += 1
            if record.reward is not None and record.reward >= self.threshold:
                self.passed += 1
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=self.done, summary=self.summary())
        elif self.out.mode is Mode.PLAIN and self.done % 50 == 0:
            self._print(f"{self.done}/{self.total} {self.summary()}")

    def summary(self) -> str:
        elapsed = max(time.monotonic() - self._started, 1e-9)
        pass_rate = self.passed / self.scored if self.scored else 0.0
        return (
            f"pass {pass_rate:.0%} · failed {self.failed} · tokens {self.tokens:,} · "
            f"{self._session_done / elapsed:.1f}/s"
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
