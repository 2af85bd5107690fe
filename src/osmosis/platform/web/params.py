"""Query and path numbers every page shares, bounded so a URL cannot ask the database for an
integer it cannot hold (SQLite's are 64-bit): such a request is a 422 page, not a 500.

    def runs_page(offset: Offset = 0) -> Response: ...
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query

MAX_INDEX = 2**31 - 1  # far beyond any run's attempts, well inside a 64-bit integer

Offset = Annotated[int, Query(ge=0, le=MAX_INDEX, description="rows to skip")]
RowIndex = Annotated[int, Path(ge=0, le=MAX_INDEX)]
RunIndex = Annotated[int, Path(ge=0, le=MAX_INDEX)]
