"""Building a rollout's environment inside the sandbox: uv and the rollout's build backend
run as workspace code, because they are.

    builder = BuildSandbox.for_policy(policy)              # starts probing bwrap
    with builder.jail(workspace=checkout, build=build_dir, uv_cache=cache, log=log) as jail:
        subprocess.run(jail.command(["pip", "install", ...]), env=jail.env, cwd="/")

A project with `dynamic = ["dependencies"]` and an in-tree backend (`backend-path = ["."]`)
runs its own Python while uv installs it. In the jail that code sees:

- the rollout's checkout read-only at `/workspace`, the venv being built at `/venv` (the only
  writable place besides the workspace's uv cache at `/uv-cache`, and the size-capped tmpfs
  `/tmp` and `HOME`), the interpreter and uv read-only, the system directories;
- a clean environment: uv's index settings as the operator set them, nothing else of the
  server's (no database URL, no tokens);
- a network namespace of its own with a loopback only; one port of it reaches the package proxy
  (`package_index`), which connects to the package index's hosts and to nothing else.

So the venv is built at `/venv` and renamed into the cache afterwards (`--relocatable`); the
rollout's sandbox binds it at `/venv` again. Nothing of the platform's home, other workspaces'
venvs or caches, `/proc` of the host or the host's loopback is reachable.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from osmosis.eval.sites.sandbox.environment import clean_base_env
from osmosis.eval.sites.sandbox.layout import (
    SANDBOX_HOME,
    SANDBOX_RUN,
    SANDBOX_VENV,
    SANDBOX_WORKSPACE,
    SHIM_PATH,
    base_mounts,
    interpreter_dirs,
    outermost,
    seen_inside,
    write_etc,
)
from osmosis.eval.sites.sandbox.package_index import PackageIndex, PackageProxy
from osmosis.eval.sites.sandbox.policy import SandboxPolicy
from osmosis.eval.sites.sandbox.support import (
    SandboxSupport,
    namespace_flags,
    probe_sandbox,
    probe_soon,
)

BUILD_UV_CACHE = "/uv-cache"
_UV_INSIDE = f"{SANDBOX_RUN}/bin/uv"
_PROXY_SOCKET = f"{SANDBOX_RUN}/proxy/proxy.sock"
_PROXY_PORT = 3128  # on the jail's own loopback: nothing else listens there
_SHIM_SOURCE = Path(__file__).with_name("shim.py")
_SITE_PREFIX = "osmosis-build-"


@dataclass(frozen=True)
class BuildSandbox:
    """How environment builds are jailed: bubblewrap, the package index, the limits."""

    bwrap: Path | None
    """The policy's bwrap; None: `find_bwrap`'s. Probed when a jail is made."""
    index: PackageIndex
    file_bytes: int
    tmp_bytes: int

    @classmethod
    def for_policy(
        cls, policy: SandboxPolicy, environ: dict[str, str] | None = None
    ) -> BuildSandbox:
        """Start probing bubblewrap (`probe_soon`: a run whose environment is cached needs no
        jail, and its sandbox site waits for the answer beside its other start-up work) and
        read the package index from `environ` (default: this process's;
        `OSMOSIS_PACKAGE_INDEX` first)."""
        probe_soon(policy.bwrap)
        return cls(
            bwrap=policy.bwrap,
            index=PackageIndex.from_environment(os.environ if environ is None else environ),
            file_bytes=policy.limits.file_bytes,
            tmp_bytes=policy.limits.memory_bytes,
        )

    @contextlib.contextmanager
    def jail(
        self,
        *,
        workspace: Path,
        build: Path,
        uv_cache: Path,
        uv: Sequence[str],
        interpreter: Path,
        readonly: Sequence[Path] = (),
        log: Callable[[str], None] = lambda line: None,
    ) -> Iterator[BuildJail]:
        """A jail for the uv commands of one build; its proxy runs while the block does.
        `SandboxUnavailable` when bubblewrap cannot run here."""
        support = probe_sandbox(self.bwrap)
        support.require()
        uv_cache.mkdir(parents=True, exist_ok=True)
        site = Path(tempfile.mkdtemp(prefix=_SITE_PREFIX))  # 0700: ours only
        try:
            write_etc(site, "bridge")
            (site / "proxy").mkdir()
            proxy = (
                PackageProxy(site / "proxy" / "proxy.sock", self.index.hosts, log=log)
                if self.index.hosts and not self.index.env.get("UV_OFFLINE")
                else None
            )
            jail = BuildJail(
                self, support, site, workspace, build, uv_cache, uv, interpreter, readonly
            )
            with proxy if proxy is not None else contextlib.nullcontext():
                jail.proxied = proxy is not None
                yield jail
        finally:
            shutil.rmtree(site, ignore_errors=True)


class BuildJail:
    """The command line and environment of uv commands run in one build's jail."""

    def __init__(
        self,
        sandbox: BuildSandbox,
        support: SandboxSupport,
        site: Path,
        workspace: Path,
        build: Path,
        uv_cache: Path,
        uv: Sequence[str],
        interpreter: Path,
        readonly: Sequence[Path],
    ) -> None:
        self.sandbox = sandbox
        self.support = support
        self.site = site
        self.workspace = workspace
        self.build = build
        self.uv_cache = uv_cache
        self.uv = Path(uv[0])
        self.interpreter = interpreter
        self.readonly = tuple(readonly)
        self.proxied = False

    def inside(self, path: Path) -> str:
        """Where a host path of the workspace or the build is seen in the jail."""
        return seen_inside(path, [(self.build, SANDBOX_VENV), (self.workspace, SANDBOX_WORKSPACE)])

    def command(self, uv_args: Sequence[str], *, cwd: Path) -> list[str]:
        """`bwrap … -- [shim …] uv <uv_args>`, run from `cwd` (a host path) as seen inside."""
        sandbox = self.sandbox
        mounts = base_mounts(self.site, "bridge", tmp_bytes=sandbox.tmp_bytes)
        readonly = [
            *interpreter_dirs(self.interpreter, None),
            *self.readonly,
            *sandbox.index.directories,
        ]
        for path in outermost(p for p in readonly if p.exists()):
            mounts += ["--ro-bind", str(path), str(path)]
        mounts += ["--ro-bind", str(self.workspace), SANDBOX_WORKSPACE]
        if (self.workspace / ".osmosis").is_dir():  # a local workspace's runs and venvs
            mounts += ["--tmpfs", f"{SANDBOX_WORKSPACE}/.osmosis"]
        mounts += ["--bind", str(self.build), SANDBOX_VENV]
        mounts += ["--bind", str(self.uv_cache), BUILD_UV_CACHE]
        mounts += ["--ro-bind", str(self.uv), _UV_INSIDE]
        uv = [_UV_INSIDE, "--no-config", *uv_args]
        argv = [
            str(self.support.bwrap),
            *namespace_flags(disable_userns=self.support.disable_userns),
            *mounts,
            "--ro-bind",
            str(_SHIM_SOURCE),
            SHIM_PATH,
        ]
        if self.proxied:
            argv += ["--ro-bind", str(self.site / "proxy"), str(Path(_PROXY_SOCKET).parent)]
        argv += ["--chdir", self.inside(cwd), "--"]
        shim = [str(self.interpreter), "-I", "-S", SHIM_PATH]
        if self.proxied:
            shim += ["--bridge-port", str(_PROXY_PORT), "--bridge-socket", _PROXY_SOCKET]
        shim += [f"--rlimit=FSIZE={sandbox.file_bytes}", "--"]
        return [*argv, *shim, *uv]

    @property
    def env(self) -> dict[str, str]:
        """What uv and the build backend see: the basics, uv's index settings, the proxy."""
        env = clean_base_env(os.environ, home=SANDBOX_HOME)
        env.update(self.sandbox.index.env)
        env |= {
            "UV_CACHE_DIR": BUILD_UV_CACHE,
            "UV_PYTHON_DOWNLOADS": "never",
            "UV_NO_PROGRESS": "1",
            # The cache and the venv are two mounts: hard links cannot cross them.
            "UV_LINK_MODE": "copy",
        }
        if self.proxied:
            proxy = f"http://127.0.0.1:{_PROXY_PORT}"
            for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
                env[name] = env[name.lower()] = proxy
        return env

    def host_paths(self) -> dict[str, str]:
        """Inside paths as errors show them: relative to the checkout, the venv by name."""
        return {SANDBOX_VENV: "<venv>", BUILD_UV_CACHE: "<uv-cache>", _UV_INSIDE: "uv"}


__all__ = ["BuildJail", "BuildSandbox"]
