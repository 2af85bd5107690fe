"""Wire models of the dataset API (`/api/datasets`), shared by the server and the client.

    page = client.datasets.list(git="owner/repo")  # DatasetList
    page.datasets[0].status  # 'uploaded'

Pydantic only: importing this module pulls in no server code.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

DatasetStatus = Literal["uploading", "processing", "uploaded", "error"]
DatasetFormat = Literal["csv", "jsonl", "parquet"]

MAX_LOG_PAGE = 200
"""Largest page of `GET /api/datasets/{name}/logs`."""
PREVIEW_ROWS = 20
"""Rows kept for `preview`; `rows` may ask for 1 to this many."""
DEFAULT_PREVIEW_ROWS = 5

NAME_MAX = 200
# Headers of the download response: what the bytes must hash to, and which version they are.
SHA256_HEADER = "X-Osmosis-Sha256"
VERSION_HEADER = "X-Osmosis-Dataset-Version"


# Characters Windows refuses in file names, and look-alikes of / and \ that a page or a shell
# could show as a directory separator.
_FORBIDDEN = frozenset(':*?"<>|') | frozenset("\uff0f\uff3c\u2215\u2044\u29f8\u29f9\u2216")
# Device names Windows reserves, with any extension: `CON.jsonl` cannot be created there.
_RESERVED = frozenset(
    {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(10)), *(f"LPT{i}" for i in range(10))}
)


def name_problem(name: str) -> str | None:
    """Why `name` cannot be a dataset name, or None when it can.

    A name is a file stem and becomes part of file names on both ends (downloads, `data/`
    on Linux, macOS and Windows), so nothing that could climb out of a directory, look like a
    separator, or be refused by one of those systems is allowed.

    >>> name_problem(".env")
    'a dataset name cannot start with a dot'
    """
    if not name:
        return "a dataset name cannot be empty"
    if "/" in name or "\\" in name:
        return "a dataset name is a file stem: it cannot contain / or \\"
    if not name.isprintable():
        return "a dataset name cannot contain NUL or other control characters"
    if name.startswith("."):
        return "a dataset name cannot start with a dot"
    if len(name) > NAME_MAX:
        return f"a dataset name has at most {NAME_MAX} characters"
    if name != name.strip() or name.endswith("."):
        return "a dataset name cannot start or end with a space, or end with a dot"
    if found := sorted(set(name) & _FORBIDDEN):
        return (
            f'a dataset name cannot contain {" ".join(found)} (Windows refuses : * ? " < > |, '
            "and a look-alike of / or \\ such as the full-width \uff0f \uff3c would pass "
            "for a separator)"
        )
    if name.split(".")[0].upper() in _RESERVED:
        return (
            f"a dataset name cannot be {name.split('.')[0]!r}: CON, PRN, AUX, NUL, COM0-9 and "
            "LPT0-9 are device names on Windows"
        )
    return None


class _Model(BaseModel):
    model_config = ConfigDict(from_attributes=True, extra="ignore")


class DatasetPublic(_Model):
    """A dataset as its newest version describes it (`version` picks an older one)."""

    id: str
    name: str
    version: int
    version_id: str
    version_count: int
    status: DatasetStatus
    file_name: str
    format: DatasetFormat
    size_bytes: int
    sha256: str
    rows: int | None
    columns: list[str] | None
    mode: str | None
    error: str | None
    created_by: str | None
    created_at: datetime
    updated_at: datetime


class DatasetList(_Model):
    datasets: list[DatasetPublic]
    total_count: int
    has_more: bool
    next_offset: int | None


class DatasetPreview(_Model):
    """The first rows of an uploaded version, as stored columns and values."""

    name: str
    version: int
    columns: list[str]
    rows: list[dict[str, Any]]
    total_rows: int


class DatasetLogPublic(_Model):
    id: int
    timestamp: datetime
    level: str
    step: str
    message: str
    version: int


class DatasetLogList(_Model):
    """Processing logs, oldest first; pass `next_cursor` back as `cursor` for the next page."""

    logs: list[DatasetLogPublic]
    next_cursor: str | None
