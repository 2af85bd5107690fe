"""Owner-only JSON files for secrets (credentials), written atomically.

Standard library only: the CLI uses this too, and must not import the server to do so.

    write_private_json(Path("~/.osmosis/credentials.json").expanduser(), {"token": "osm_..."})
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_private_json(path: Path, data: dict[str, Any]) -> None:
    """Atomically replace `path` with `data`, readable by the owner only (mode 0600).

    The temporary file is created 0600, so the secret is never readable by others, not even
    for an instant.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2)
            handle.write("\n")
        os.chmod(tmp, 0o600)  # O_CREAT's mode only applies to new files
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
