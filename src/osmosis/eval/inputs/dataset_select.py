"""Which rows of a dataset an evaluation runs: `--rows`, else `limit`, else the default.

The default differs by host, as in the reference: a local `eval run` takes every row
(`fraction=None`), the platform a seeded random 10 % sample (`SAMPLE_FRACTION`).

A selection is only a sorted tuple of source row indices, so it costs memory in proportion to
the rows selected, never to the file; `osmosis.eval.inputs.dataset.read_rows` then streams
just those.
A selected row's `row_index` is its position in the selection (0..N-1), the number the platform
shows; `source_row_index` stays the file offset.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from typing import Literal

__all__ = ["SAMPLE_FRACTION", "RowSpecError", "Selection", "parse_row_spec", "select_rows"]

SAMPLE_FRACTION = 0.10
_TOKEN = re.compile(r"^(\d+)(?:\s*-\s*(\d+))?$")


class RowSpecError(ValueError):
    """A `--rows` value that cannot be used; the message lists every problem in it."""


@dataclass(frozen=True)
class Selection:
    """The rows one evaluation runs.

    `rows` holds source row indices in ascending order; the i-th entry is `row_index` i.
    `seed` is set when the rows were sampled at random: the same seed over the same number of
    rows draws the same sample, so a run records it.

    >>> select_rows(40, limit=3)
    Selection(rows=(0, 1, 2), total_rows=40, method='limit', seed=None)
    """

    rows: tuple[int, ...]
    total_rows: int
    method: Literal["rows", "limit", "sample", "all"]
    seed: int | None = None

    def __len__(self) -> int:
        return len(self.rows)


def parse_row_spec(spec: str, *, total_rows: int | None = None) -> tuple[int, ...]:
    """Parse `--rows` ("3,7,10-20": offsets and inclusive ranges) into sorted unique offsets.

    Offsets are 0-based source rows. With `total_rows`, offsets past the end are refused.

    >>> parse_row_spec("10-12,3, 7")
    (3, 7, 10, 11, 12)
    """
    problems: list[str] = []
    spans: list[tuple[int, int]] = []
    tokens = [token.strip() for token in spec.split(",")]
    if not spec.strip():
        raise RowSpecError("--rows is empty: give offsets and ranges such as '3,7,10-20'")
    for token in tokens:
        match = _TOKEN.match(token)
        if not match:
            if token.startswith("-") or re.match(r"^\d+\s*-\s*-", token):
                problems.append(f"{token!r}: row offsets are non-negative integers")
            elif not token:
                problems.append("empty item (two commas in a row, or a trailing comma)")
            else:
                problems.append(f"{token!r} is not an offset or a range like '10-20'")
            continue
        start = int(match.group(1))
        end = int(match.group(2)) if match.group(2) is not None else start
        if end < start:
            problems.append(
                f"range {token!r} must be ascending (start <= end), e.g. '{end}-{start}'"
            )
            continue
        spans.append((start, end))
    if total_rows is not None:
        last = total_rows - 1
        for start, end in spans:
            if end > last:
                shown = str(start) if start == end else f"{start}-{end}"
                valid = f"valid offsets are 0-{last}" if total_rows else "it has no rows"
                problems.append(
                    f"row {shown} is out of range: the dataset has {total_rows} rows ({valid})"
                )
    if problems:
        raise RowSpecError(f"invalid --rows {spec!r}: " + "; ".join(problems))
    offsets: set[int] = set()
    for start, end in spans:
        offsets.update(range(start, end + 1))
    return tuple(sorted(offsets))


def select_rows(
    total_rows: int,
    *,
    limit: int | None = None,
    rows: str | None = None,
    seed: int | None = None,
    fraction: float | None = SAMPLE_FRACTION,
) -> Selection:
    """Choose the rows to run: `rows` (a `--rows` spec) wins, then `limit`, then a random
    sample of `fraction` of the rows, or every row when `fraction` is None.

    The sample is `fraction` of the rows rounded up, at least one. Without `seed` a fresh one is
    drawn and returned in the selection, so the run can record it and reproduce the sample.

    >>> select_rows(100, seed=7) == select_rows(100, seed=7)
    True
    >>> select_rows(100, rows="0,2").rows
    (0, 2)
    >>> select_rows(3, fraction=None)
    Selection(rows=(0, 1, 2), total_rows=3, method='all', seed=None)
    """
    if total_rows < 0:
        raise ValueError(f"total_rows must be >= 0, got {total_rows}")
    if rows is not None:
        return Selection(parse_row_spec(rows, total_rows=total_rows), total_rows, "rows")
    if limit is not None:
        if isinstance(limit, bool) or limit < 1:
            raise ValueError(f"limit must be an integer >= 1, got {limit!r}")
        return Selection(tuple(range(min(limit, total_rows))), total_rows, "limit")
    if fraction is None:
        return Selection(tuple(range(total_rows)), total_rows, "all")
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    if seed is None:
        seed = random.SystemRandom().randrange(2**31)
    count = min(total_rows, max(1, math.ceil(total_rows * fraction)))
    # `sample` over a range keeps O(count) memory however large the dataset is.
    picked = random.Random(seed).sample(range(total_rows), count)
    return Selection(tuple(sorted(picked)), total_rows, "sample", seed)
