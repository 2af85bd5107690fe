"""Query and path numbers every page shares, bounded so a URL cannot ask the database for an
integer it cannot hold (SQLite's are 64-bit): such a request is a 422 page, not a 500.

    def runs_page(offset: Offset = 0) -> Response: ...
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Path

# The API's bound and offset type: pages and routes refuse the same numbers.
from osmosis.platform.deps import MAX_OFFSET as MAX_INDEX
from osmosis.platform.deps import Offset

__all__ = ["MAX_INDEX", "Offset", "RowIndex", "RunIndex"]

RowIndex = Annotated[int, Path(ge=0, le=MAX_INDEX)]
RunIndex = Annotated[int, Path(ge=0, le=MAX_INDEX)]
