"""The entrypoint's pre-flight import: a child interpreter imports it with the rollout
directory on `sys.path`, in the background, and says whether it imported.

    with Preflight(entrypoint, rollout_dir) as preflight:   # started now
        ...                                                 # the command's requests
        warning = preflight.result()                        # None, a warning, or VALIDATION

`early_preflight` starts one from a config's raw TOML, before the command's other imports and
checks (`eval submit`, and `submit_early` at the command's entry). Standard library only at
module level: it runs before typer loads.
"""

from __future__ import annotations

import sys
from pathlib import Path

PREFLIGHT_TIMEOUT_S = 60  # an entrypoint that serves at import time would never return


_PREFLIGHT = """
import json, os, runpy, sys, traceback
entrypoint, rollout_dir, result = sys.argv[1:4]
sys.path.insert(0, rollout_dir)
outcome = {"ok": True}
try:
    runpy.run_path(entrypoint, run_name="__osmosis_preflight__")
except SystemExit as error:
    if error.code not in (None, 0):
        outcome = {"ok": False, "missing_module": False, "last": f"SystemExit: {error.code}"}
except BaseException as error:
    outcome = {
        "ok": False,
        "missing_module": isinstance(error, ModuleNotFoundError),
        "last": traceback.format_exception_only(type(error), error)[-1].strip(),
    }
with open(result, "w", encoding="utf-8") as handle:
    json.dump(outcome, handle)
# Answered: the submit waits for this exit, not for the teardown of all the entrypoint
# imported (~30 ms), its exit handlers or threads.
os._exit(0)
"""


class Preflight:
    """The entrypoint imported in a child process with the rollout directory on sys.path,
    started now, in the background, and answered by `result()`: the child interpreter's start
    and the entrypoint's import (~0.5 s) overlap the requests.

    As a context manager: a failure of the body (the platform unreachable, say) is reported
    as the import's own failure when the import failed, as it was before anything was sent;
    the child is never left running.
    """

    def __init__(self, entrypoint: Path, rollout_dir: Path) -> None:
        import subprocess
        import tempfile
        import time

        self.entrypoint, self.rollout_dir = entrypoint, rollout_dir
        self._scratch = tempfile.TemporaryDirectory(prefix="osmosis-preflight-")
        self._result_file = Path(self._scratch.name) / "result.json"
        self._deadline = time.monotonic() + PREFLIGHT_TIMEOUT_S
        # Its output is not read: DEVNULL, so a chatty import never blocks on a full pipe.
        args = [str(entrypoint), str(rollout_dir), str(self._result_file)]
        self._child = subprocess.Popen(
            [sys.executable, "-c", _PREFLIGHT, *args],
            cwd=rollout_dir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._answer: tuple[str | None] | None = None
        self._error: Exception | None = None

    def __enter__(self) -> Preflight:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        try:
            if kind is not None and kind is not KeyboardInterrupt:
                self.result()  # the import's failure, if it failed, is the one to report
        finally:
            self.close()

    def close(self) -> None:
        if self._child.poll() is None:
            self._child.kill()
            self._child.wait()
        self._scratch.cleanup()

    def result(self) -> str | None:
        """A warning (a module the rollout needs is not installed here, or the import took
        too long), None when it imported; raises VALIDATION with the traceback's last line
        when the code itself fails."""
        import json
        import subprocess
        import time

        from osmosis.cli.output import CLIError

        if self._error is not None:
            raise self._error
        if self._answer is not None:
            return self._answer[0]
        try:
            self._child.wait(timeout=max(self._deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            self.close()
            self._answer = (
                f"pre-flight import of {self.entrypoint.name} did not finish in "
                f"{PREFLIGHT_TIMEOUT_S}s",
            )
            return self._answer[0]
        try:
            outcome = json.loads(self._result_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            outcome = {"ok": False, "missing_module": False, "last": "the interpreter crashed"}
        finally:
            self._scratch.cleanup()
        where = (
            f"rollouts/{self.rollout_dir.name}/"
            f"{self.entrypoint.relative_to(self.rollout_dir).as_posix()}"
        )
        if outcome["ok"]:
            self._answer = (None,)
        elif outcome["missing_module"]:
            self._answer = (
                f"pre-flight import of {where}: {outcome['last']} (not installed here; the "
                "platform installs the rollout's own dependencies)",
            )
        else:
            self._error = CLIError(
                f"pre-flight import of {where} failed: {outcome['last']}",
                details={"entrypoint": where, "error": outcome["last"]},
                hint=f"run `python {where}` to see the whole traceback",
            )
            raise self._error
        return self._answer[0]


def early_preflight(config_path: Path, top: Path) -> Preflight | None:
    """The pre-flight import started from the config's raw TOML, before anything else is
    imported or checked: its answer (a child interpreter importing the entrypoint, ~0.5 s) is
    what a submit waits for last. None unless `[experiment]` names a rollout directory of
    the workspace at `top` (resolved) and an entrypoint file inside it; the checked config
    decides whether it stands (`_preflight_for`)."""
    import tomllib

    try:
        text = config_path.read_text(encoding="utf-8")
        experiment = tomllib.loads(text).get("experiment", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    rollout = experiment.get("rollout") if isinstance(experiment, dict) else None
    entrypoint = experiment.get("entrypoint") if isinstance(experiment, dict) else None
    if not (isinstance(rollout, str) and rollout and isinstance(entrypoint, str) and entrypoint):
        return None
    rollouts = top / "rollouts"
    rollout_dir = rollouts / rollout
    path = rollout_dir / entrypoint
    try:
        inside = rollout_dir.resolve().parent == rollouts.resolve() and path.resolve(
            strict=True
        ).is_relative_to(rollout_dir.resolve())
    except OSError:
        return None
    return Preflight(path, rollout_dir) if inside and path.is_file() else None
