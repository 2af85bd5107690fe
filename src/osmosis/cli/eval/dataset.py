"""A local `eval run` without a local data file: the platform's dataset, fetched and cached.

As in the reference, `osmosis eval run` with no `--dataset-file` and no `data/<dataset>.*`
evaluates the platform dataset of that name when a platform is configured (a token from
`OSMOSIS_TOKEN`, `osmosis auth login` or the local server). The file is kept in

    ${XDG_CACHE_HOME:-~/.cache}/osmosis/datasets/<dataset id>/<sha256>/<name>.<format>

and reused only while the platform's newest version has that SHA-256 and the cached bytes
hash to it: a changed dataset or a damaged cache file is downloaded again.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from osmosis.user_cache import user_cache_dir

if TYPE_CHECKING:
    from osmosis.eval.host.plan import DatasetNotFound, RunOptions


def dataset_cache_root(environ: Mapping[str, str]) -> Path:
    """Where platform datasets are cached for local runs."""
    return user_cache_dir(environ) / "datasets"


def with_platform_dataset(
    config_path: Path, options: RunOptions, missing: DatasetNotFound
) -> RunOptions:
    """`options` with the platform dataset as `dataset_file` (origin `cache` or `download`).

    Without a configured platform the original "not found" error stands; a platform that
    cannot give the dataset says why, next to what was looked for locally.
    """
    from osmosis.cli.credentials import open_client, platform_errors, resolve
    from osmosis.cli.output import CLIError
    from osmosis.eval.inputs.dataset_formats import sha256_file
    from osmosis.workspace import WorkspaceError, resolve_workspace

    name = str(missing.details.get("dataset"))
    local = CLIError(str(missing), details=missing.details, hint=missing.hint or None)
    if resolve(None, os.environ).token is None:
        raise local  # no platform configured: nothing else to try
    try:
        workspace = resolve_workspace(config_path.resolve().parent)
    except WorkspaceError as error:
        raise CLIError(
            f"{missing}; and the platform dataset cannot be fetched: {error.message}",
            details=missing.details,
            hint=error.hint or missing.hint or None,
        ) from None
    try:
        with platform_errors(), open_client(None) as client:
            info = client.datasets.get(git=workspace.identity, name=name)
            if info.status != "uploaded":
                raise CLIError(
                    f"dataset {name} on {client.base_url} is {info.status}, not uploaded",
                    details={"dataset": name, "status": info.status},
                    hint=f"osmosis dataset info {name}",
                )
            target = dataset_cache_root(options.environ) / info.id / info.sha256
            target = target / f"{info.name}.{info.format}"
            if target.is_file() and sha256_file(target) == info.sha256:
                origin = "cache"
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                client.datasets.download(
                    git=workspace.identity, name=name, dest=target, version=info.version
                )
                origin = "download"
    except CLIError as error:
        if error.code in {"NOT_FOUND", "NETWORK", "AUTH_REQUIRED"}:
            raise CLIError(
                f"{missing}; and the platform could not give it: {error.message}",
                code=error.code,
                details={**missing.details, "platform": error.details},
                hint=missing.hint or None,
            ) from None
        raise
    return dataclasses.replace(options, dataset_file=target, dataset_origin=origin)
