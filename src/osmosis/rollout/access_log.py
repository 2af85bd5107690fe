"""Which uvicorn access lines are protocol noise: the controller's own polling.

A rollout server answers `GET /health`, `POST /rollout`, the long-poll
`GET /rollout/{id}/result` and `POST /rollout/cancel` several times per attempt. Logged by
uvicorn's default access log, those lines bury the rollout's own messages in the run's log
(and the dashboard's log tail). Both ends drop them: `create_rollout_server` filters its
access logger (`ProtocolAccessFilter`), and the engine skips such lines when a rollout built
on another SDK (osmosis-ai) prints them (`is_protocol_access_line`). Server errors (5xx)
are always kept.

    is_protocol_access_line('INFO:     127.0.0.1:5 - "POST /rollout HTTP/1.1" 202 Accepted')
    # True

Standard library only.
"""

from __future__ import annotations

import logging
import re

__all__ = ["ProtocolAccessFilter", "is_protocol_access_line", "is_protocol_path"]

_PROTOCOL_PATH = re.compile(r"^/(?:health|rollout(?:/cancel|/[^/?]+/result)?)/?(?:\?.*)?$")
# uvicorn's default access format: `INFO:     <client> - "<METHOD> <path> HTTP/x" <status> ...`
_ACCESS_LINE = re.compile(
    r'^(?:\S+\s+)*INFO:?\s+\S+ - "(?:GET|POST|HEAD) (?P<path>\S+) HTTP/[\d.]+" (?P<status>\d{3})\b'
)


def is_protocol_path(path: str) -> bool:
    """True for the rollout protocol's routes (query strings included)."""
    return _PROTOCOL_PATH.match(path) is not None


def is_protocol_access_line(line: str) -> bool:
    """True when `line` is uvicorn's access line for a protocol route that did not fail."""
    match = _ACCESS_LINE.match(line.strip())
    return bool(match and int(match["status"]) < 500 and is_protocol_path(match["path"]))


class ProtocolAccessFilter(logging.Filter):
    """A filter for the `uvicorn.access` logger that drops protocol routes' lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        # uvicorn logs (client, method, path, http_version, status) with this message.
        if isinstance(args, tuple) and len(args) == 5:
            path, status = args[2], args[4]
            if isinstance(status, int) and status < 500 and is_protocol_path(str(path)):
                return False
        return True
