"""Where the dashboard's run pages read from: one small interface, two implementations.

    source: Source                       # a page's dependency
    run = source.find("smoke-brave-otter-1a2b")
    source.samples(run).query(SampleQuery(text="timeout"))

`PlatformSource` (source_platform.py) reads the database and `<home>/runs/<id>/`, scoped to
the signed-in viewer; `LocalSource` (source_local.py) reads `.osmosis/evals/<name>/` for
`osmosis eval view`, read-only and without login. Pages and templates only see `RunView`s and
`SampleIndex`es, so there is one set of both. Whatever a source is, a run's attempts (for the
samples list, search, CSV and compare) come from its run directory's journal through the same
`SampleIndex` (samples_index.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Protocol

from fastapi import Depends, Request

from osmosis.platform.core.errors import NotFound
from osmosis.platform.web.samples_index import SampleIndex
from osmosis.platform.web.session import Viewer
from osmosis.vocabulary import (
    DEFAULT_PASS_THRESHOLD,
    OUTCOMES,
    RUN_STATUSES,
    TERMINAL_RUN_STATUSES,
    outcomes_of_counts,
)

RUNS_PER_PAGE = 25
# pending and running: a local run is live while `running` too (its lock is held).
LIVE_STATUSES = tuple(s for s in RUN_STATUSES if s not in TERMINAL_RUN_STATUSES)


class RunNotFound(NotFound):
    """No run by that name (or id) here; the same answer whether it exists elsewhere or not."""


@dataclass(frozen=True)
class Tally:
    """A run's counts over what is recorded so far (a running run's grow)."""

    completed: int = 0
    total: int = 0
    graded: int = 0
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    tokens: int = 0
    avg_reward: float | None = None
    pass_rate: float | None = None
    recorded_outcomes: Mapping[str, int] | None = None
    """The engine's count of each outcome (metrics.json `summary.outcomes`), when it has one."""

    @property
    def all_failed(self) -> bool:
        """Attempts were recorded and not one of those scored ended without an error."""
        return self.failed > 0 and self.failed == self.completed - self.skipped

    @property
    def outcomes(self) -> dict[str, int]:
        """How many attempts came to each outcome (`osmosis.vocabulary.outcome`): the engine's
        count when it covers every recorded attempt, else from the counts (errored = failed)."""
        recorded = self.recorded_outcomes
        if recorded is not None and sum(recorded.get(k, 0) for k in OUTCOMES) == self.completed:
            return {name: int(recorded.get(name, 0)) for name in OUTCOMES}
        counts = outcomes_of_counts(
            completed=self.completed, passed=self.passed, failed=self.failed, skipped=self.skipped
        )
        return {name: count for name, count in counts.items()}


@dataclass(frozen=True)
class RunDetail:
    """What only a run's own page shows: how it was configured and what it cost."""

    config: dict[str, Any] = field(default_factory=dict)
    config_path: str = ""
    entrypoint: str = ""
    branch: str | None = None
    commit_sha: str | None = None
    env: dict[str, Any] = field(default_factory=dict)
    secret_scopes: dict[str, str] = field(default_factory=dict)
    dataset_version: int | None = None
    dataset_rows: int | None = None
    dataset_sha256: str | None = None
    rows_digest: str | None = None
    """Identity of the selected rows, where the source records one (a local manifest)."""
    pass_threshold: float = DEFAULT_PASS_THRESHOLD
    cost_usd: float | None = None
    errors_by_type: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class RunView:
    """One run as every page shows it, whichever source it came from.

    `ref` is what URLs name it by (the platform's run name; a local run's directory name).
    Statuses: the platform's pending/running/finished/failed/stopped, and a local run's
    running/finished/incomplete (interrupted or halted: `eval run` again resumes it).
    """

    ref: str
    id: str
    name: str
    status: str
    dataset: str
    model: str
    rollout: str
    tally: Tally
    workspace: str | None = None
    creator: str | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    completed_at: datetime | None = None
    duration_ms: float | None = None
    error: str | None = None
    stop_requested: bool = False
    detail: RunDetail | None = None

    @property
    def live(self) -> bool:
        return self.status in LIVE_STATUSES

    @property
    def shown_status(self) -> str:
        """The status badge: a run that finished with every attempt errored is `all errored`,
        never a green `finished`."""
        if self.status == "finished" and self.tally.all_failed:
            return "all errored"
        return self.status


@dataclass(frozen=True)
class RunFilters:
    """The runs list's filters, as kept in the URL; empty means "any"."""

    status: str = ""
    dataset: str = ""
    model: str = ""
    rollout: str = ""
    workspace: str = ""

    def params(self) -> dict[str, str]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name)}

    def admits(self, run: RunView) -> bool:
        wanted = (
            (self.status, run.status),
            (self.dataset, run.dataset),
            (self.model, run.model),
            (self.rollout, run.rollout),
            (self.workspace, run.workspace or ""),
        )
        return all(not want or want == value for want, value in wanted)


@dataclass(frozen=True)
class RunsPage:
    rows: list[RunView]
    total: int
    offset: int
    limit: int
    params: dict[str, Any]


@dataclass(frozen=True)
class FilterChoices:
    """The values each filter can take, for the filter menus (no workspaces: no menu)."""

    statuses: Sequence[str] = ()
    datasets: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    rollouts: list[str] = field(default_factory=list)
    workspaces: list[str] = field(default_factory=list)


class RunSource(Protocol):
    """What the run pages read. `viewer` is None and `read_only` True in `eval view`."""

    @property
    def viewer(self) -> Viewer | None: ...

    @property
    def read_only(self) -> bool: ...

    def list_runs(self, filters: RunFilters, *, limit: int, offset: int) -> RunsPage:
        """One page of runs, newest first, with the total matching `filters`."""
        ...

    def filter_choices(self) -> FilterChoices: ...

    def find(self, ref: str) -> RunView:
        """The run named `ref`, with its `detail`; `RunNotFound` otherwise."""
        ...

    def run_dir(self, run: RunView) -> Path:
        """The run's directory: journal, trajectories, artifacts, logs."""
        ...

    def results(self, run: RunView) -> dict[str, Any]:
        """metrics.json's summary once written; before that, the same figures computed from
        the attempts recorded so far."""
        ...

    def rewards(self, run: RunView) -> list[float]:
        """Every graded reward, for the histogram."""
        ...

    def samples(self, run: RunView) -> SampleIndex:
        """The run's attempts, current as of this call."""
        ...


def page_source(request: Request) -> Iterator[RunSource]:
    """The source the app was built with: `install_dashboard` or `create_view_app` sets
    `app.state.run_source` to a function of the request that yields one."""
    yield from request.app.state.run_source(request)


Source = Annotated[RunSource, Depends(page_source)]


def page_params(values: Mapping[str, Any]) -> dict[str, Any]:
    """Query parameters that say something: None and "" dropped."""
    return {key: value for key, value in values.items() if value is not None and value != ""}
