"""How large, deep and strange a dataset may be: the limits every reader and validator applies.

A dataset file is untrusted input (a 7 KB Parquet file can hold 200 MB of strings), so the
readers bound what one row, one cell and the whole file may cost before anything is held in
memory, and `cell_problem` refuses values that would break a page or a database later: text
with NUL or a lone surrogate, or a value nested deeper than a JSON library can walk.

    cell_problem({"a": [1, 2]})    # None
    cell_problem("a\\x00b")         # 'contains a NUL character (U+0000), ...'

The defaults are the limits of `osmosis dataset validate`, `eval run` and the platform alike,
so a file one of them accepts the others accept too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_LIMITS", "DatasetLimits", "cell_problem"]

_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class DatasetLimits:
    """The bounds on one dataset file.

    `max_cell_bytes`: the most one cell may hold, as UTF-8 (for a nested value, its strings
    and keys together, plus 8 bytes per other value). A JSONL line or a CSV line may be at
    most four times that. `max_depth`: how deeply objects and arrays (Parquet: structs and
    lists) may nest inside one cell. `max_rows`, `max_columns`: of the file.
    `max_decompressed_bytes`: what the Parquet columns eval reads may decompress to (text
    formats are their own size). `batch_bytes`: about how much decompressed Parquet data is
    turned into rows at once (a batch is never less than one row).

        DatasetLimits(max_cell_bytes=1024)  # a small bound for a test
    """

    max_cell_bytes: int = 16 * 1024 * 1024
    max_depth: int = 32
    max_rows: int = 10_000_000
    max_columns: int = 1_000
    max_decompressed_bytes: int = 20 * 1024**3
    batch_bytes: int = 16 * 1024 * 1024

    @property
    def max_line_bytes(self) -> int:
        return 4 * self.max_cell_bytes

    @property
    def too_deep_to_read(self) -> str:
        return (
            f"nested too deeply to read; a cell may nest at most {self.max_depth} levels of "
            "objects and arrays"
        )

    @property
    def too_large(self) -> str:
        return f"holds more than {self.max_cell_bytes:,} bytes; a cell may hold at most that"


DEFAULT_LIMITS = DatasetLimits()


def cell_problem(value: Any, limits: DatasetLimits = DEFAULT_LIMITS) -> str | None:
    """Why one cell's value cannot be stored or shown, or None when it can.

    Walks the value without recursion, so a value nested 100,000 deep costs a loop, not a
    RecursionError.
    """
    size = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if problem := _text_problem(item):
                return problem
            # isascii() is free for Python strings; only other text is measured by encoding.
            size += len(item) if item.isascii() else len(item.encode("utf-8"))
        elif isinstance(item, (dict, list, tuple)):
            depth += 1
            if depth > limits.max_depth:
                return (
                    f"is nested more than {limits.max_depth} levels deep (objects and "
                    "arrays); a cell may nest at most that"
                )
            children = [*item.keys(), *item.values()] if isinstance(item, dict) else list(item)
            size += len(children)
            stack.extend((child, depth) for child in children)
        else:
            size += 8
        if size > limits.max_cell_bytes:
            return limits.too_large
    return None


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "contains a NUL character (U+0000), which text may not hold; remove it"
    if not text.isascii() and (found := _SURROGATE.search(text)):
        code = f"{ord(found.group()):04x}"
        return (
            f"contains a lone surrogate (U+{code.upper()}), which is not valid Unicode; fix "
            f"the \\u{code} escape or save the text as UTF-8"
        )
    return None
