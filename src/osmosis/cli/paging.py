"""`--limit N` / `--all` for list commands: one page, or every page, of a paged API route.

page = collect(lambda limit, offset: client.secrets.list(git=g, limit=limit, offset=offset),
               items=lambda page: page.secrets, limit=20, everything=False)
page.items, page.total_count, page.has_more, page.next_offset
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from osmosis.vocabulary import MAX_PAGE

DEFAULT_LIMIT = MAX_PAGE


def check_limit(limit: int, *, everything: bool) -> None:
    """`--all` and a chosen `--limit` contradict each other: a usage error (exit 2)."""
    if everything and limit != DEFAULT_LIMIT:
        from osmosis.cli.output import CLIError

        raise CLIError(
            f"--all and --limit {limit} cannot be used together",
            details={"limit": limit, "all": True},
            hint=f"--all lists everything; --limit N shows the first N (1-{MAX_PAGE})",
            exit_code=2,
        )


class _Paged(Protocol):
    total_count: int
    has_more: bool
    next_offset: int | None


PageT = TypeVar("PageT", bound=_Paged)


@dataclass(frozen=True)
class Collected:
    """What a list command shows: the items, and whether the server holds more."""

    items: list[Any]
    total_count: int
    has_more: bool
    next_offset: int | None


def collect(
    fetch: Callable[[int, int], PageT],
    *,
    items: Callable[[PageT], Sequence[Any]],
    limit: int,
    everything: bool,
) -> Collected:
    """The first `limit` items, or with `everything` all of them, following `next_offset`."""
    gathered: list[Any] = []
    offset = 0
    while True:
        page = fetch(MAX_PAGE if everything else limit, offset)
        gathered.extend(items(page))
        if not everything or not page.has_more or page.next_offset is None:
            return Collected(gathered, page.total_count, page.has_more, page.next_offset)
        offset = page.next_offset
