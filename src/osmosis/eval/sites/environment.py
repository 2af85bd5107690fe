"""The Python environment a rollout runs in: the current interpreter, or a cached uv venv.

    env = prepare_environment(Path("rollouts/multiply"), cache_root=cache, log=print)
    env.python  # the interpreter that runs `main.py`, exec'd directly (never `uv run`)

A rollout without `pyproject.toml` runs with the engine's own interpreter. A rollout with one
gets an isolated venv holding its declared dependencies (or its `uv.lock` pins) and an SDK:
ours at the running version, or `osmosis-ai` when the rollout declares that instead. Venvs
live under `cache_root/<key>`, keyed by what decides their contents, so an unchanged rollout
reuses its venv without calling uv. Nothing here downloads a Python build
(`UV_PYTHON_DOWNLOADS=never`); packages come from the configured index.

The rollout's files are untrusted (another workspace's, on the platform):
- uv runs with `--no-config`, so a committed `uv.toml` or `[tool.uv]` never picks an index,
  find-links or any other setting, and `pip install` with `--no-sources`;
- a build input that is a link (`pyproject.toml`, `uv.lock`, `uv.toml`…, and for a
  dynamic-dependency project any file of the copy it builds) is refused before uv sees it;
- the key covers the scope (the workspace) and every file of the rollout directory, so two
  workspaces never share a venv, and a finished venv is made read-only;
- uv's output in an error is capped and names no host path (home, cache, checkout).

A build may take minutes: hosts call `prepare_environment_async`, which runs it in a thread
(the event loop keeps honouring Ctrl-C and `eval stop`) and, when cancelled, kills uv's
process group and removes the half-built venv.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import tomllib
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from osmosis._version import DISTRIBUTION, __version__
from osmosis.eval.errors import HostError
from osmosis.eval.inputs.sources import copy_ignore, source_bytes, source_digest, source_files

if TYPE_CHECKING:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    from osmosis.eval.sites.sandbox.build import BuildJail, BuildSandbox

EnvironmentKind = Literal["current", "uv"]
SdkName = Literal["osmosis", "osmosis-ai"]

# Bump when the venv layout or the way it is built changes: old cache entries stop matching.
_LAYOUT_VERSION = 1
_MARKER = "osmosis-env.json"  # written last, inside the build dir: present means complete
_BUILD_LOG = "osmosis-build.log"
_REQUIREMENTS = "osmosis-requirements.txt"
_SOURCE_COPY = "osmosis-rollout-source"  # only while installing a dynamic-dependency project
# Left out of a dynamic-dependency project's copy and key besides what is never source: what a
# build writes into the tree it builds, and hidden files (tool state, `.env` secrets), which
# must not land in the shared cache.
_NOT_BUILD_INPUT = (".*", "build", "dist", "*.egg-info")
_UV_TIMEOUT_SEC = 1800.0
_CANCEL_POLL_SEC = 0.2
_CANCEL_WAIT_SEC = 15.0
_PROBE_TIMEOUT_SEC = 10.0
_ERROR_TAIL_LINES = 20
# osmosis-ai 0.3 declares `Requires-Python >=3.12`; a rollout that forgets to say so still
# needs it, so the floor is applied whatever its own `requires-python` says.
_OSMOSIS_AI_REQUIRES_PYTHON = ">=3.12"
_OUR_REQUIRES_PYTHON_FALLBACK = ">=3.11"
_PYENV_VERSION_DIR = re.compile(r"^\d+\.\d+\.\d+$")  # CPython builds only: no pypy-, no -dev
_ERROR_LINE_CHARS = 300
_WRITE_BITS = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH
# What uv, a build backend or `.python-version` readers may consult in the rollout directory.
_BUILD_INPUTS = (
    "pyproject.toml",
    "uv.lock",
    "uv.toml",
    ".python-version",
    "setup.py",
    "setup.cfg",
    "requirements*.txt",
)


@dataclass(frozen=True)
class RolloutEnvironment:
    """Where and how a rollout's entrypoint runs.

    env = prepare_environment(rollout_dir, cache_root=cache, log=print)
    subprocess.Popen([env.python, "main.py"], cwd=rollout_dir)
    """

    python: Path
    """The interpreter to exec the entrypoint with."""
    kind: EnvironmentKind
    """`current`: the engine's own interpreter; `uv`: a cached venv built from pyproject.toml."""
    cache_key: str | None
    """The venv's cache key (its directory name under the cache root); None for `current`."""
    sdk: SdkName
    """Which rollout SDK the environment provides: ours, or the `osmosis-ai` one."""

    @property
    def venv(self) -> Path | None:
        """The venv directory of a `uv` environment, None for the current interpreter."""
        return self.python.parent.parent if self.kind == "uv" else None


class RolloutEnvironmentError(HostError):
    """A rollout's environment could not be prepared. The message names the rollout, the
    step that failed and, for a uv failure, the last lines uv printed."""

    default_hint = "fix the rollout's pyproject.toml (or uv.lock); nothing was dispatched"

    def __init__(self, rollout: str, step: str, reason: str, output: Sequence[str] = ()) -> None:
        self.rollout = rollout
        self.step = step
        self.output_tail = list(output)[-_ERROR_TAIL_LINES:]
        message = f"rollout {rollout!r}: {step} failed: {reason}"
        if self.output_tail:
            message += "\n" + "\n".join(f"  | {line}" for line in self.output_tail)
        super().__init__(message)


class EnvironmentNotBuilt(RolloutEnvironmentError):
    """`prepare_environment(build=False)` found no venv for the rollout, cached or in the
    making: a caller that may only reuse one (a spare server) builds nothing."""

    default_hint = "a run of this rollout builds it, in its own log"

    def __init__(self, rollout: str, key: str) -> None:
        super().__init__(rollout, "reusing its environment", f"{key[:12]} is not built")


class BuildInputLinkError(RolloutEnvironmentError):
    """A file the environment build reads is a symbolic link: refused before uv runs, so no
    host file it points to is ever read, built from or quoted. `path` is the link, relative
    to the checkout."""

    default_hint = "commit the file itself, not a link to it; nothing was dispatched"

    def __init__(self, rollout: str, shown: str) -> None:
        self.path = shown
        super().__init__(
            rollout,
            "checking the build inputs",
            f"{shown} is a symbolic link; build inputs must be regular files",
        )


@dataclass(frozen=True)
class Interpreter:
    """An installed Python found on this machine."""

    path: Path
    version: Version


async def prepare_environment_async(
    rollout_dir: Path,
    *,
    cache_root: Path,
    log: Callable[[str], None],
    scope: str | None = None,
    checkout: Path | None = None,
    sandbox: BuildSandbox | None = None,
) -> RolloutEnvironment:
    """`prepare_environment` in a worker thread; `log` is called on the event loop.
    Cancelling the await stops uv (its whole process group) and cleans up, then re-raises.

    env = await prepare_environment_async(rollout_dir, cache_root=cache, log=run.log)
    """
    if not (rollout_dir / "pyproject.toml").is_file():
        # Nothing to build or check: answered at once, not from a thread, so a run spawns its
        # rollout servers before the bridge's setup takes the event loop.
        return prepare_environment(rollout_dir, cache_root=cache_root, log=log)
    loop = asyncio.get_running_loop()
    cancel = threading.Event()

    def log_on_loop(line: str) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody reads the log
            loop.call_soon_threadsafe(log, line)

    build = asyncio.ensure_future(
        asyncio.to_thread(
            prepare_environment,
            rollout_dir,
            cache_root=cache_root,
            log=log_on_loop,
            cancel=cancel,
            scope=scope,
            checkout=checkout,
            sandbox=sandbox,
        )
    )
    try:
        return await asyncio.shield(build)
    except asyncio.CancelledError:
        cancel.set()
        # Give the thread a moment to kill uv and remove the half-built venv.
        await asyncio.wait({build}, timeout=_CANCEL_WAIT_SEC)
        if build.done() and not build.cancelled():
            build.exception()  # read: "cancelled" is the expected answer
        raise


def prepare_environment(
    rollout_dir: Path,
    *,
    cache_root: Path,
    log: Callable[[str], None],
    cancel: threading.Event | None = None,
    scope: str | None = None,
    checkout: Path | None = None,
    sandbox: BuildSandbox | None = None,
    build: bool = True,
) -> RolloutEnvironment:
    """Return the environment to run the rollout in `rollout_dir`, building it if needed.
    `scope` (the workspace) is part of the venv's key: venvs are never shared across scopes.
    `checkout`: the repository root, against which errors name the rollout's files.
    `sandbox`: run uv (and so the rollout's build backend) in the build jail
    (`sites.sandbox.build`), with a uv cache of the scope's own; None: on the host.
    `build=False`: only a cached venv, or one another process is building (waited for);
    `EnvironmentNotBuilt` when there is neither.

    env = prepare_environment(Path("rollouts/multiply"), cache_root=home / "envs", log=print)
    env.kind, env.sdk  # ('uv', 'osmosis') for a rollout with a pyproject.toml

    Blocking (it may run uv for minutes): async code uses `prepare_environment_async`. Raises
    `RolloutEnvironmentError` with the failing step and uv's last lines; when `cancel` is
    set it stops uv and raises one saying so; `BuildInputLinkError` for a linked input.
    """
    cancel = cancel or threading.Event()
    _refuse_linked_inputs(rollout_dir, checkout)
    rollout_dir = rollout_dir.resolve()
    name = rollout_dir.name
    pyproject_path = rollout_dir / "pyproject.toml"
    if not pyproject_path.is_file():
        log("→ no pyproject.toml: running the rollout with the current interpreter")
        return RolloutEnvironment(
            python=Path(sys.executable), kind="current", cache_key=None, sdk="osmosis"
        )

    declaration = _read_declaration(name, pyproject_path)
    if declaration.dynamic_dependencies:  # a build backend reads any file of its copy
        _refuse_linked_inputs(rollout_dir, checkout, every_source=True)
    sdk: SdkName = "osmosis-ai" if "osmosis-ai" in declaration.names else "osmosis"
    python_spec = _python_spec(name, declaration.requires_python, sdk)
    interpreter = choose_interpreter(python_spec, rollout=name)
    # Our SDK goes in unless the rollout brings osmosis-ai; a declared `osmosis` is always
    # served by our own source, never by a same-named package from the index.
    ours = _our_requirement(name) if sdk == "osmosis" or "osmosis" in declaration.names else None
    lock_path = rollout_dir / "uv.lock"
    lock_bytes = lock_path.read_bytes() if lock_path.is_file() else None
    # Every file of the rollout directory decides the venv (a dynamic-dependency build may read
    # any), and the scope keeps one workspace's venv from ever serving another's runs.
    declared = f"scope={scope}".encode() + b"\0" + _build_input_digest(rollout_dir)
    key = _cache_key(declared, lock_bytes, interpreter, ours)
    described = f"Python {interpreter.version}, {sdk} SDK"

    cache_root.mkdir(parents=True, exist_ok=True)
    final = cache_root / key
    if _is_ready(final):
        log(f"→ reusing cached environment {key[:12]} ({described})")
        return _environment(final, key, sdk)
    with _build_lock(cache_root / f"{key}.lock", name, key, log, cancel):
        if _is_ready(final):  # another run built it while we waited for the lock
            log(f"→ reusing cached environment {key[:12]} ({described})")
            return _environment(final, key, sdk)
        if not build:
            raise EnvironmentNotBuilt(name, key)
        log(f"→ syncing rollout dependencies ({described}) into environment {key[:12]}")
        started = time.monotonic()
        _build(
            rollout_dir,
            cache_root=cache_root,
            key=key,
            interpreter=interpreter,
            declaration=declaration,
            lock_bytes=lock_bytes,
            ours=ours,
            sdk=sdk,
            cancel=cancel,
            sandbox=sandbox,
            workspace=(checkout or rollout_dir.parent).resolve(),
            scope=scope,
            log=log,
        )
        log(f"→ environment {key[:12]} ready in {time.monotonic() - started:.1f} s")
    return _environment(final, key, sdk)


def find_interpreters() -> list[Interpreter]:
    """Installed CPython interpreters: the current one, `python3.X` on PATH and pyenv's
    versions, deduplicated and sorted by version.

    [str(i.version) for i in find_interpreters()]  # ['3.11.7', '3.12.1', '3.13.0']
    """
    from packaging.version import Version

    found: dict[Path, Interpreter] = {}

    def add(path: Path, version: Version | None) -> None:
        try:
            real = path.resolve(strict=True)
        except OSError:
            return
        if real in found or not os.access(real, os.X_OK):
            return
        if version is None:
            version = _probe_version(path)
        if version is not None:
            found[real] = Interpreter(path=path, version=version)

    current = Version(".".join(str(part) for part in sys.version_info[:3]))
    if platform.python_implementation() == "CPython":
        add(Path(sys.executable), current)
    pyenv_versions = _pyenv_root() / "versions"
    if pyenv_versions.is_dir():
        for entry in sorted(pyenv_versions.iterdir()):
            if _PYENV_VERSION_DIR.match(entry.name):  # the name is the version: no probe
                add(entry / "bin" / "python", Version(entry.name))
    for minor in range(8, 20):
        located = shutil.which(f"python3.{minor}")
        # pyenv shims only forward to the versions already listed, and fail for inactive ones.
        if located and f"{os.sep}shims{os.sep}" not in located:
            add(Path(located), None)
    return sorted(found.values(), key=lambda interpreter: interpreter.version)


def choose_interpreter(spec: SpecifierSet, *, rollout: str = "rollout") -> Interpreter:
    """The interpreter for a `requires-python` specifier: the current one when it satisfies,
    else the lowest installed version that does, else what `uv python find` knows.

    choose_interpreter(SpecifierSet(">=3.12"))  # Interpreter(path=…/3.12.1/bin/python, …)
    """
    from packaging.version import Version

    current = Version(".".join(str(part) for part in sys.version_info[:3]))
    if current in spec and platform.python_implementation() == "CPython":
        return Interpreter(path=Path(sys.executable), version=current)
    candidates = find_interpreters()
    for interpreter in candidates:  # sorted ascending: the first match is the lowest
        if interpreter.version in spec:
            return interpreter
    from_uv = _uv_find_python(spec)
    if from_uv is not None:
        return from_uv
    seen = ", ".join(f"{i.version} ({i.path})" for i in candidates) or "none"
    raise RolloutEnvironmentError(
        rollout,
        "choosing a Python interpreter",
        f"it needs Python {spec}, and no installed interpreter satisfies that "
        f"(found: {seen}). Install a matching one (pyenv, `uv python install`, or the "
        "system's packages); osmosis never downloads Python itself.",
    )


def find_uv() -> list[str]:
    """The command that runs uv: the binary beside this interpreter, the `uv` package's
    binary, `uv` on PATH, or `python -m uv`.

    subprocess.run([*find_uv(), "--version"])
    """
    beside = Path(sys.executable).parent / "uv"
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    try:
        from uv import find_uv_bin  # the PyPI `uv` package ships its binary

        return [find_uv_bin()]
    except (ImportError, FileNotFoundError):
        pass
    on_path = shutil.which("uv")
    if on_path:
        return [on_path]
    return [sys.executable, "-m", "uv"]


# --- the dependency declaration -------------------------------------------------------------


@dataclass(frozen=True)
class _Declaration:
    raw: bytes
    dependencies: list[str]
    names: frozenset[str]
    requires_python: str | None
    dynamic_dependencies: bool


def _read_declaration(rollout: str, path: Path) -> _Declaration:
    # packaging is imported here: a rollout without a pyproject.toml never needs it.
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    raw = path.read_bytes()
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise RolloutEnvironmentError(rollout, "reading pyproject.toml", str(exc)) from None
    project = data.get("project", {})
    if not isinstance(project, dict):
        raise RolloutEnvironmentError(rollout, "reading pyproject.toml", "[project] is not a table")
    dependencies = project.get("dependencies", [])
    if not isinstance(dependencies, list) or not all(isinstance(d, str) for d in dependencies):
        raise RolloutEnvironmentError(
            rollout, "reading pyproject.toml", "[project].dependencies must be a list of strings"
        )
    names: set[str] = set()
    for dependency in dependencies:
        try:
            names.add(canonicalize_name(Requirement(dependency).name))
        except InvalidRequirement as exc:
            raise RolloutEnvironmentError(
                rollout, "reading pyproject.toml", f"invalid dependency {dependency!r}: {exc}"
            ) from None
    requires_python = project.get("requires-python")
    if requires_python is not None and not isinstance(requires_python, str):
        raise RolloutEnvironmentError(
            rollout, "reading pyproject.toml", "[project].requires-python must be a string"
        )
    dynamic = project.get("dynamic", [])
    return _Declaration(
        raw=raw,
        dependencies=list(dependencies),
        names=frozenset(names),
        requires_python=requires_python,
        dynamic_dependencies=isinstance(dynamic, list) and "dependencies" in dynamic,
    )


def _python_spec(rollout: str, requires_python: str | None, sdk: SdkName) -> SpecifierSet:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    floor = _OSMOSIS_AI_REQUIRES_PYTHON if sdk == "osmosis-ai" else _our_requires_python()
    try:
        return SpecifierSet(requires_python or "") & SpecifierSet(floor)
    except InvalidSpecifier as exc:
        raise RolloutEnvironmentError(
            rollout, "reading pyproject.toml", f"invalid requires-python: {exc}"
        ) from None


def _our_requires_python() -> str:
    try:
        return metadata.metadata(DISTRIBUTION)["Requires-Python"] or _OUR_REQUIRES_PYTHON_FALLBACK
    except (metadata.PackageNotFoundError, KeyError):
        return _OUR_REQUIRES_PYTHON_FALLBACK


def _our_requirement(rollout: str) -> str:
    """A requirements-file line that installs the running osmosis, from where it came from.

    A development install (`pip install -e`) points at its source tree and stays editable, so
    the venv follows the source without a version bump; a wheel or directory install is
    installed again from the same file; otherwise the exact version from the index.
    """
    try:
        distribution = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise RolloutEnvironmentError(
            rollout, "locating the osmosis SDK", "osmosis is not installed as a distribution"
        ) from None
    direct = distribution.read_text("direct_url.json")
    if direct:
        info: dict[str, Any] = json.loads(direct)
        url = str(info.get("url", ""))
        if url.startswith("file://"):
            source = Path(url.removeprefix("file://"))
            if source.exists():
                if info.get("dir_info", {}).get("editable"):
                    return f"-e {source}"
                return f"{DISTRIBUTION} @ {source.as_uri()}"
    return f"{DISTRIBUTION}=={distribution.version}"


def _cache_key(
    declared: bytes, lock: bytes | None, interpreter: Interpreter, ours: str | None
) -> str:
    digest = hashlib.sha256()
    for part in (
        f"layout={_LAYOUT_VERSION}".encode(),
        hashlib.sha256(declared).digest(),
        hashlib.sha256(lock).digest() if lock is not None else b"no-lock",
        f"python={interpreter.version}@{interpreter.path}".encode(),
        f"osmosis={__version__}".encode(),
        f"sdk={ours}".encode(),
    ):
        digest.update(part + b"\0")
    return digest.hexdigest()[:32]


# --- the venv cache ---------------------------------------------------------------------------


def _environment(root: Path, key: str, sdk: SdkName) -> RolloutEnvironment:
    return RolloutEnvironment(python=root / "bin" / "python", kind="uv", cache_key=key, sdk=sdk)


def _is_ready(root: Path) -> bool:
    # `exists` follows the python symlink: a venv whose base interpreter vanished is not ready.
    return (root / _MARKER).is_file() and (root / "bin" / "python").exists()


@contextlib.contextmanager
def _build_lock(
    path: Path, rollout: str, key: str, log: Callable[[str], None], cancel: threading.Event
) -> Iterator[None]:
    # flock is per open file description, so it also serialises threads of one process, and
    # the kernel drops it when a crashed builder dies: no stale-lock cleanup is ever needed.
    with path.open("a") as handle:
        waiting = False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waiting:
                    waiting = True
                    log(f"→ waiting for another run to finish building environment {key[:12]}")
            # Polled rather than blocking in flock, so that a cancelled run stops waiting.
            if cancel.wait(_CANCEL_POLL_SEC):
                raise RolloutEnvironmentError(rollout, "waiting for another build", "cancelled")
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(
    rollout_dir: Path,
    *,
    cache_root: Path,
    key: str,
    interpreter: Interpreter,
    declaration: _Declaration,
    lock_bytes: bytes | None,
    ours: str | None,
    sdk: SdkName,
    cancel: threading.Event,
    sandbox: BuildSandbox | None,
    workspace: Path,
    scope: str | None,
    log: Callable[[str], None],
) -> None:
    name = rollout_dir.name
    final = cache_root / key
    for stale in cache_root.glob(f".build-{key}-*"):  # left by a crashed builder; we hold the lock
        _remove_tree(stale)
    if final.exists():  # complete once, broken since (its interpreter went away)
        _remove_tree(final)
    # Built beside its final place and renamed into it: the rename is atomic, so the cache
    # only ever holds complete venvs. `--relocatable` keeps the venv valid after the move.
    build = cache_root / f".build-{key}-{uuid.uuid4().hex[:8]}"
    transcript: list[str] = []
    try:
        with contextlib.ExitStack() as stack:
            jail: BuildJail | None = None
            if sandbox is not None:
                build.mkdir()  # the jail binds it at /venv
                jail = stack.enter_context(
                    sandbox.jail(
                        workspace=workspace,
                        build=build,
                        uv_cache=_scope_uv_cache(cache_root, scope),
                        uv=find_uv(),
                        interpreter=interpreter.path,
                        readonly=_sdk_sources(ours),
                        log=log,
                    )
                )
                log(
                    "→ building in the sandbox: the checkout read-only, packages only from "
                    + sandbox.index.shown
                )
            seen = jail.inside if jail is not None else str
            _run_uv(
                name,
                "creating the virtual environment",
                [
                    "venv",
                    seen(build),
                    "--python",
                    str(interpreter.path),
                    "--relocatable",
                    "--no-project",
                ],
                cwd=rollout_dir,
                transcript=transcript,
                cancel=cancel,
                cache_root=cache_root,
                jail=jail,
            )
            requirements = build / _REQUIREMENTS
            lines = _requirements(
                rollout_dir, build, declaration, lock_bytes, ours, transcript, cancel, jail
            )
            requirements.write_text("\n".join(lines) + "\n", encoding="utf-8")
            _run_uv(
                name,
                "installing the rollout's dependencies",
                # Bytecode now, once: with PYTHONDONTWRITEBYTECODE set, a rollout importing
                # LiteLLM would otherwise compile it again at every start (seconds of CPU).
                [
                    "pip",
                    "install",
                    "--compile-bytecode",
                    "--no-sources",  # a dynamic project's [tool.uv.sources] must not name a path
                    "--python",
                    seen(build / "bin" / "python"),
                    "-r",
                    seen(requirements),
                ],
                cwd=rollout_dir,  # relative path requirements; never its settings (`--no-config`)
                transcript=transcript,
                cancel=cancel,
                cache_root=cache_root,
                jail=jail,
            )
        shutil.rmtree(build / _SOURCE_COPY, ignore_errors=True)
        (build / _BUILD_LOG).write_text("\n".join(transcript) + "\n", encoding="utf-8")
        marker = {
            "cache_key": key,
            "rollout": name,
            "python": str(interpreter.path),
            "python_version": str(interpreter.version),
            "sdk": sdk,
            "osmosis_version": __version__,
            "created_at": datetime.now(UTC).isoformat(),
        }
        (build / _MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        _make_read_only(build)  # the runs reusing it must not change it for the next ones
        build.rename(final)
    except BaseException:
        _remove_tree(build)
        raise


def _requirements(
    rollout_dir: Path,
    build: Path,
    declaration: _Declaration,
    lock_bytes: bytes | None,
    ours: str | None,
    transcript: list[str],
    cancel: threading.Event,
    jail: BuildJail | None,
) -> list[str]:
    if lock_bytes is not None:
        lines = _exported_lock(rollout_dir, build.parent, transcript, cancel, jail)
        if ours is not None:  # a lock pins `osmosis` from the index: an unrelated package
            lines = [line for line in lines if _requirement_name(line) != "osmosis"]
    elif declaration.dynamic_dependencies:
        # Only a build can tell what it needs, so the project is installed, from a copy:
        # build backends write `build/` and `*.egg-info` into the tree they build.
        copy = build / _SOURCE_COPY
        # Links are copied as links: a committed link to a file outside the rollout must not
        # land as that file's bytes in the shared cache.
        shutil.copytree(
            rollout_dir, copy, symlinks=True, ignore=copy_ignore(also_exclude=_NOT_BUILD_INPUT)
        )
        lines = [jail.inside(copy) if jail is not None else str(copy)]
    else:
        # A declared `osmosis>=x` stays: uv then installs our source once and checks that
        # its version satisfies the rollout's constraint.
        lines = list(declaration.dependencies)
    return lines if ours is None else [*lines, ours]


def _exported_lock(
    rollout_dir: Path,
    cache_root: Path,
    transcript: list[str],
    cancel: threading.Event,
    jail: BuildJail | None,
) -> list[str]:
    """The pins of the rollout's uv.lock as requirements (what `uv sync` would install),
    without the rollout project itself, which is often not a buildable package."""
    output = _run_uv(
        rollout_dir.name,
        "exporting uv.lock",
        ["export", "--frozen", "--no-hashes", "--no-emit-project", "--no-header", "--no-annotate"],
        cwd=rollout_dir,
        transcript=transcript,
        cancel=cancel,
        stdout_only=True,
        cache_root=cache_root,
        jail=jail,
    )
    return [line for line in output if line.strip() and not line.lstrip().startswith("#")]


def _build_input_digest(rollout_dir: Path) -> bytes:
    """SHA-256 of what a build may read, as part of the venv key: the rollout's sources minus
    `_NOT_BUILD_INPUT` (exactly the files `_requirements` copies for a dynamic-dependency
    build), plus the hidden inputs uv or a build backend may consult (`.python-version`)."""
    digest = hashlib.sha256(
        bytes.fromhex(source_digest(rollout_dir, also_exclude=_NOT_BUILD_INPUT))
    )
    for path in _named_inputs(rollout_dir):
        if path.name.startswith("."):
            digest.update(path.name.encode() + b"\0" + source_bytes(path) + b"\0")
    return digest.digest()


def _named_inputs(rollout_dir: Path) -> list[Path]:
    found: list[Path] = []
    for pattern in _BUILD_INPUTS:
        found += sorted(rollout_dir.glob(pattern))
    return found


def _refuse_linked_inputs(
    rollout_dir: Path, checkout: Path | None, *, every_source: bool = False
) -> None:
    """Raise `BuildInputLinkError` when a build input is a link: the named inputs, the
    directories from the checkout down to the rollout, and with `every_source` each file a
    dynamic-dependency build copies. The error names the link relative to the checkout."""
    base = checkout if checkout is not None else rollout_dir.parent

    def shown(path: Path) -> str:
        # Resolved without following the link itself: its parent is a real directory.
        for inside, root in ((path, base), (path.parent.resolve() / path.name, base.resolve())):
            with contextlib.suppress(ValueError):
                return inside.relative_to(root).as_posix()
        return f"{rollout_dir.name}/{path.name}"

    if checkout is not None:
        try:
            parts = rollout_dir.relative_to(checkout).parts
        except ValueError:
            parts = ()
        for depth in range(1, len(parts) + 1):
            if (checkout.joinpath(*parts[:depth])).is_symlink():
                raise BuildInputLinkError(
                    rollout_dir.name, shown(checkout.joinpath(*parts[:depth]))
                )
    elif rollout_dir.is_symlink():
        raise BuildInputLinkError(rollout_dir.name, shown(rollout_dir))
    candidates = _named_inputs(rollout_dir)
    if every_source:
        candidates += source_files(rollout_dir, also_exclude=_NOT_BUILD_INPUT)
    for path in candidates:
        if path.is_symlink():
            raise BuildInputLinkError(rollout_dir.name, shown(path))


def _scope_uv_cache(cache_root: Path, scope: str | None) -> Path:
    """The uv cache of one scope (a workspace): a build in the sandbox writes only there, so
    what one workspace's build leaves in it never serves another's."""
    digest = hashlib.sha256(f"scope={scope}".encode()).hexdigest()[:16]
    return cache_root / ".uv-cache" / digest


def _sdk_sources(ours: str | None) -> list[Path]:
    """Where the requirement line for our SDK installs it from, when that is a local path
    (a development checkout, a wheel): bound read-only into the build sandbox."""
    if ours is None:
        return []
    if ours.startswith("-e "):
        return [Path(ours.removeprefix("-e ").strip())]
    _, _, url = ours.partition(" @ ")
    return [Path(url.removeprefix("file://"))] if url.startswith("file://") else []


def _make_read_only(root: Path) -> None:
    """Take every write bit off a built venv (its directories too: no file can be added or
    replaced). Links are left alone: chmod would follow them to the interpreter."""
    for dirpath, dirnames, filenames in os.walk(root):
        for entry in [*filenames, *dirnames]:
            path = os.path.join(dirpath, entry)
            if not os.path.islink(path):
                os.chmod(path, stat.S_IMODE(os.lstat(path).st_mode) & ~_WRITE_BITS)
    os.chmod(root, stat.S_IMODE(os.lstat(root).st_mode) & ~_WRITE_BITS)


def _remove_tree(root: Path) -> None:
    """`shutil.rmtree` that also removes a read-only venv: its directories get their owner's
    write bit back first (removing an entry needs it on the directory holding it)."""
    if not root.exists() and not root.is_symlink():
        return
    if root.is_dir() and not root.is_symlink():
        for dirpath, dirnames, _ in os.walk(root):
            with contextlib.suppress(OSError):
                os.chmod(dirpath, stat.S_IMODE(os.lstat(dirpath).st_mode) | stat.S_IRWXU)
            dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
    shutil.rmtree(root, ignore_errors=True)


def _requirement_name(line: str) -> str | None:
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    try:
        return canonicalize_name(Requirement(line).name)
    except InvalidRequirement:
        return None  # an option or a path line: never our SDK


def _run_uv(
    rollout: str,
    step: str,
    args: list[str],
    *,
    cwd: Path,
    transcript: list[str],
    cancel: threading.Event,
    stdout_only: bool = False,
    cache_root: Path | None = None,
    jail: BuildJail | None = None,
) -> list[str]:
    if jail is not None:  # in the build sandbox: the jail says the command and environment
        command, env, run_in = jail.command(args, cwd=cwd), jail.env, Path("/")
        transcript.append("$ uv --no-config " + " ".join(args))
    else:
        env = dict(os.environ)
        env["UV_PYTHON_DOWNLOADS"] = "never"  # offline-safe: only installed interpreters
        env["UV_NO_PROGRESS"] = "1"
        for variable in ("VIRTUAL_ENV", "UV_PYTHON", "UV_PROJECT_ENVIRONMENT"):
            env.pop(variable, None)  # the engine's own venv must not steer what uv builds
        # `--no-config`: the rollout's `uv.toml` or `[tool.uv]` is never read (no index, no
        # find-links, no settings of its choosing); the operator's environment variables are.
        command, run_in = [*find_uv(), "--no-config", *args], cwd
        transcript.append("$ " + " ".join(command))
    try:
        process = subprocess.Popen(
            command,
            cwd=run_in,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,  # one group: a cancel also stops the build backends
        )
    except FileNotFoundError:
        raise RolloutEnvironmentError(
            rollout, step, "uv is not installed (pip install uv)"
        ) from None
    give_up_at = time.monotonic() + _UV_TIMEOUT_SEC
    while True:
        try:
            out, err = process.communicate(timeout=_CANCEL_POLL_SEC)  # no output is lost
            break
        except subprocess.TimeoutExpired:
            if cancel.is_set() or time.monotonic() > give_up_at:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
                out, err = process.communicate()
                if cancel.is_set():
                    raise RolloutEnvironmentError(rollout, step, "cancelled") from None
                raise RolloutEnvironmentError(
                    rollout,
                    step,
                    f"uv did not finish within {_UV_TIMEOUT_SEC:.0f} s",
                    _shown(_lines(out) + _lines(err), cwd, cache_root, jail),
                ) from None
    stdout, stderr = _lines(out), _lines(err)
    transcript.extend(stderr if stdout_only else stdout + stderr)
    if process.returncode != 0:
        tail = deque(stdout + stderr, maxlen=_ERROR_TAIL_LINES)
        raise RolloutEnvironmentError(
            rollout, step, f"uv exited {process.returncode}", _shown(tail, cwd, cache_root, jail)
        )
    return stdout


def _shown(
    lines: Iterable[str],
    rollout_dir: Path,
    cache_root: Path | None,
    jail: BuildJail | None = None,
) -> list[str]:
    """uv's lines as a run error shows them: host paths replaced (the rollout directory, the
    venv cache, the home and the running interpreter's prefix; in the jail, its own paths),
    each line capped."""
    replacements = sorted(
        {
            **({jail.inside(rollout_dir): "."} if jail is not None else {}),
            **(jail.host_paths() if jail is not None else {}),
            **({str(cache_root): "<env-cache>"} if cache_root is not None else {}),
            str(rollout_dir): ".",
            str(Path.home()): "~",
            sys.prefix: "<python>",
            sys.base_prefix: "<python>",
        }.items(),
        key=lambda pair: -len(pair[0]),
    )
    shown: list[str] = []
    for line in lines:
        for host, placeholder in replacements:
            if len(host) > 1:
                line = line.replace(host, placeholder)
        if len(line) > _ERROR_LINE_CHARS:
            line = line[:_ERROR_LINE_CHARS] + " …"
        shown.append(line)
    return shown


def _lines(output: str | bytes | None) -> list[str]:
    if output is None:
        return []
    if isinstance(output, bytes):
        output = output.decode("utf-8", "replace")
    return output.splitlines()


# --- interpreters -----------------------------------------------------------------------------


def _pyenv_root() -> Path:
    configured = os.environ.get("PYENV_ROOT")
    if configured:
        return Path(configured)
    return Path.home() / ".pyenv"  # pyenv's default; asking `pyenv root` costs a subprocess


def _probe_version(path: Path) -> Version | None:
    from packaging.version import InvalidVersion, Version

    # %-formatting: an old Python 2 found on PATH must answer too, not crash on an f-string.
    code = (
        "import platform, sys; "
        "print(platform.python_implementation(), '%d.%d.%d' % sys.version_info[:3])"
    )
    try:
        completed = subprocess.run(
            [str(path), "-I", "-c", code],
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT_SEC,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    parts = completed.stdout.split()
    if completed.returncode != 0 or len(parts) != 2 or parts[0] != "CPython":
        return None
    try:
        return Version(parts[1])
    except InvalidVersion:
        return None


def _uv_find_python(spec: SpecifierSet) -> Interpreter | None:
    """Ask uv, which also knows interpreters it manages itself, without downloading any."""
    env = dict(os.environ, UV_PYTHON_DOWNLOADS="never")
    try:
        completed = subprocess.run(
            [*find_uv(), "python", "find", "--no-python-downloads", str(spec)],
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT_SEC,
            check=False,
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    located = completed.stdout.strip()
    if completed.returncode != 0 or not located:
        return None
    version = _probe_version(Path(located))
    if version is None or version not in spec:
        return None
    return Interpreter(path=Path(located), version=version)


__all__ = [
    "BuildInputLinkError",
    "EnvironmentNotBuilt",
    "Interpreter",
    "RolloutEnvironment",
    "RolloutEnvironmentError",
    "choose_interpreter",
    "find_interpreters",
    "find_uv",
    "prepare_environment",
    "prepare_environment_async",
]
