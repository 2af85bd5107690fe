"""`osmosis eval run`'s rollout server, started at the command's entry (issue 30).

    begin(["eval", "run", "configs/eval/smoke.toml", "-y"])  # spawned, if the line allows
    ...                                                      # typer, the plan, the run
    end()                                                    # killed, if nobody adopted it

A fresh interpreter importing FastAPI and uvicorn takes ~0.4 s, as long as this command's own
start; started first, the two overlap. `begin` reads the line and the config with the
standard library alone (no typer, no pydantic) and spawns only when the launch is known now,
exactly as the local site would make it (`osmosis.eval.sites.prestart`, which the site asks
before it spawns): one config under `<workspace>/configs/eval/`, `--yes` (no user code runs
before the user said yes), options that leave the launch alone (`_FLAGS`, `_VALUED`), a
rollout with no `pyproject.toml` (the engine's own interpreter), no `[secrets]` and no
dotenv file. Anything else, or any doubt: nothing is started and the run starts its server
as it always did. A run without `--name` gets the name computed here (`run_name`).
With `--sandbox` the server starts in the sandbox as a spare (`sites.sandbox.spare`, with
the bridge's port bound now), which the run's sandbox site adopts only when its whole launch
is the site's own.
"""

from __future__ import annotations

import os
import re
import sys
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path

from osmosis.cli.early_line import EarlyLine, read_line

# `eval run` options that change nothing of the rollout server's launch.
_FLAGS = frozenset({"-y", "--yes", "--verbose", "--retry-failed", "--upload", "--sandbox"})
_VALUED = frozenset(
    {"--name", "--dataset-file", "--rows", "--model", "-n", "--limit", "--max-in-flight",
     "--replicas", "--executor", "--bridge-host", "--bridge-url", "--outage-wait",
     "--stall-after", "--max-tokens-total", "--max-cost-usd", "--max-model-calls", "--cache",
     "--min-pass-rate", "--min-mean-reward", "--report", "--junit"}
)  # fmt: skip
# Of those, the values that keep the one local server: anything else changes the site.
_ONLY = {"--replicas": "1", "--executor": "local"}
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
_BUILD_INPUTS = ("pyproject.toml", "uv.lock", "uv.toml", ".python-version", "setup.py", "setup.cfg")

_run_name: str | None = None
_started = False
_made: list[Path] = []  # directories a sandboxed early start made, the outermost first


def begin(argv: Sequence[str], environ: Mapping[str, str] = os.environ) -> None:
    """Start the rollout server `argv` (the command line, without the program) will ask
    for, when everything it depends on is known now; otherwise do nothing. Never raises:
    the run itself reports any problem."""
    global _run_name, _started
    try:
        line = _read(argv, environ)
        early = _early(line)
        if early is None:
            if line is not None and "--sandbox" in line.flags:
                from osmosis.eval.sites.sandbox.support import probe_soon

                # The run's sandbox site waits for this answer (~10-50 ms) before it starts
                # its server: asked now, it is in by then.
                probe_soon()
            return
        rollout_dir, entrypoint, env, name, run_dir, line = early
        if "--sandbox" in line.flags:
            host = line.values.get("--bridge-host", ["127.0.0.1"])[-1]  # the option's default
            started: object | None = _start_sandboxed(rollout_dir, entrypoint, env, run_dir, host)
        else:
            from osmosis.eval.sites import prestart

            started = prestart.start_early(
                rollout_dir, entrypoint, env=env, artifact_root=run_dir / "rollout_trials"
            )
    except Exception:  # an unreadable file, a link loop: the run starts its own, and says why
        return
    if started is not None:
        _run_name, _started = name, True


def run_name() -> str | None:
    """The default run name `begin` started the server for (None: it started none, or the
    line gave `--name`); the command names its run so, for the server to fit it."""
    return _run_name


def end() -> None:
    """Kill and reap the early server if nobody adopted it. Idempotent."""
    global _run_name, _started
    if _started:
        from osmosis.eval.sites import prestart

        prestart.discard()
        if "osmosis.eval.sites.sandbox.spare" in sys.modules:
            sys.modules["osmosis.eval.sites.sandbox.spare"].discard()
        while _made:
            try:
                _made.pop().rmdir()  # the deepest first; only when left empty
            except OSError:
                break
    _run_name, _started = None, False


def _start_sandboxed(
    rollout_dir: Path, entrypoint: str, env: dict[str, str], run_dir: Path, bridge_host: str
) -> object:
    """The sandboxed server `--sandbox` will ask for, started as a spare the run's sandbox
    site adopts only when its whole launch is the site's own (`sites.sandbox.spare`): the
    default policy, the workspace's `.osmosis` masked, the bridge's port bound now."""
    # The launch's own modules only: the site's (pydantic, the rollout protocol) would
    # delay this start by more than the server takes to come up.
    from osmosis.eval.sites.prestart import CurrentInterpreter
    from osmosis.eval.sites.sandbox import spare
    from osmosis.eval.sites.sandbox.launcher import start_spare
    from osmosis.eval.sites.sandbox.policy import SandboxPolicy

    workspace = rollout_dir.parents[1]
    # The outbox is made inside the run's directory: what did not exist is removed again if
    # the run never adopts the server (an error before it starts leaves no run behind).
    _made.extend(reversed([d for d in (run_dir, *run_dir.parents) if not d.exists()]))
    held = start_spare(
        CurrentInterpreter(),  # what the environment check answers for a plain rollout
        rollout_dir,
        entrypoint,
        env=env,
        policy=SandboxPolicy(),
        workspace=workspace,
        trials_root=run_dir / "rollout_trials",
        hidden=(workspace / ".osmosis",),
        bridge_host=bridge_host,
    )
    spare.hold(held, bridge_host=bridge_host)
    return held


def _read(argv: Sequence[str], environ: Mapping[str, str]) -> EarlyLine | None:
    """`eval run`'s line as read here (None: another command, or not readable now)."""
    return read_line(argv, ("eval", "run"), flags=_FLAGS, valued=_VALUED, environ=environ)


def _early(
    line: EarlyLine | None,
) -> tuple[Path, str, dict[str, str], str | None, Path, EarlyLine] | None:
    """(rollout dir, absolute entrypoint, [env], default name or None, run dir, the line read)
    of the one server the line (None: unreadable here) will start, or None when that is not
    certain now."""
    # --yes: no user code runs before the user said yes.
    if line is None or not line.flags & {"-y", "--yes"}:
        return None
    values, config = line.values, line.config
    if len(values.get("--model", [])) > 1 or any(
        value != _ONLY[flag] for flag in _ONLY for value in values.get(flag, [])
    ):
        return None
    workspace = config.parents[2]
    with config.open("rb") as handle:
        data = tomllib.load(handle)
    experiment, env = data.get("experiment"), data.get("env", {})
    if not isinstance(experiment, dict) or data.get("secrets") != {"required": []}:
        return None
    rollout, entrypoint = experiment.get("rollout"), experiment.get("entrypoint")
    if not (isinstance(rollout, str) and isinstance(entrypoint, str) and isinstance(env, dict)):
        return None
    if not all(
        isinstance(value, str) and _ENV_NAME.match(key) and not key.startswith("_OSMOSIS_")
        for key, value in env.items()
    ):
        return None
    rollout_dir = workspace / "rollouts" / rollout
    if not _plain_rollout(workspace, rollout_dir, entrypoint):
        return None
    given = values.get("--name")
    name = given[0] if given else None
    if name is None:
        from osmosis.eval.host.run_name import default_run_name

        name = default_run_name(config)
    if not name or "/" in name or name.startswith("."):
        return None  # the plan refuses it
    run_dir = workspace / ".osmosis" / "evals" / name
    return rollout_dir, str(rollout_dir / entrypoint), env, None if given else name, run_dir, line


def _plain_rollout(workspace: Path, rollout_dir: Path, entrypoint: str) -> bool:
    """A rollout that runs on the engine's own interpreter, with nothing the environment
    check would refuse: no link on the way down, an entrypoint inside it, no build inputs."""
    if "/" in rollout_dir.name or rollout_dir.name in ("", ".", ".."):
        return False
    for path in (workspace / "rollouts", rollout_dir):
        if path.is_symlink() or not path.is_dir():
            return False
    target = rollout_dir / entrypoint
    if not target.is_file() or not target.resolve().is_relative_to(rollout_dir.resolve()):
        return False
    return not any(
        (rollout_dir / name).exists() or (rollout_dir / name).is_symlink() for name in _BUILD_INPUTS
    )


__all__ = ["begin", "end", "run_name"]
