"""The sandbox site: each rollout server under bubblewrap, reaching only its run and the bridge.

    site = SandboxSite(environment, rollout_dir, "main.py", env=variables,
                       trials_root=run_dir / "rollout_trials", log=log, redactor=redactor,
                       policy=SandboxPolicy(), workspace=checkout,
                       bridge_url=bridge.base_url, bridge_address=("127.0.0.1", port))
    async with site:
        await site.start(replicas=2)
        ...                               # Engine(site=site, ...), as with the local site

A host asks for it with `SandboxSiteSpec` (`osmosis.eval.sites.spec.start_site`). It is the
local-process site with three differences (see `osmosis.eval.sites.sandbox` for the
sandbox itself):

- **Launch.** `RolloutProcess` starts `bwrap … -- python -I -S shim.py … -- python main.py`:
  new user, PID, IPC, UTS, mount and network namespaces, the file system of
  `osmosis.eval.sites.sandbox.layout`, a clean environment, inside a cgroup with the policy's
  limits.
  The engine reaches the server through a Unix socket whose listening descriptor the shim
  holds: the shim connects to the server inside and hands that TCP socket back over it
  (`Http1Client`'s `handoff`). The rollout's connections to the bridge's port inside are
  handed the same way to this site's `BridgeForwarder` (which gives them to the bridge's own
  server when it runs in this event loop). No process copies a byte in between. The shim
  runs as bytecode compiled here when the rollout's interpreter is ours (`compile_shim`).
- **Outputs.** The rollout writes its attempts under `<trials_root>.sandbox/<rollout_id>`
  (the only writable bind). When an attempt ends its directory is renamed out of the
  sandbox's reach, and `trial()` *copies* `trajectory.json`, `diagnostics.json` and
  `artifacts/` from it (regular files only, no links, no mode bits, capped at the attempt's
  limits) into a fresh `trials_root/<rollout_id>`; what a leftover process of the attempt
  writes afterwards lands in the renamed directory, where it is counted, never in a kept file
  (`osmosis.eval.sites.sandbox.disk`).
- **Limits.** A watcher reads the cgroup's counters and, every second, the disk the server
  holds (its attempts in the outbox, stray files there, its `/tmp` and `HOME`); when the
  memory, process or disk limit is hit, or an attempt in flight goes past its output limit, it
  marks the endpoint dead with its `breach` (a `ResourceLimitBreach`, also its `death_reason`
  in words) *before* it kills the sandbox, so the engine charges the attempt that ran alone on
  it and requeues the others as suspects (re-run alone). A finished attempt whose files
  reached the file-size limit or exceed the output bytes is answered as a `ResultWithBreach`
  (a failure `resource_limit`) instead of its result, and keeps no files; one that leaves the
  server past its disk quota ends the server the same way as the watcher does. Restarts after
  a resource limit do not use the endpoint's restart budget.

The launch itself (bwrap, the shim, the site's directory) is `sandbox.launcher`'s. A server
can be started ahead (`launcher.start_spare`, held by `osmosis.eval.sites.sandbox.spare`):
the site's first endpoint is that server when its launch is the one the site would make, its
outbox renamed to the site's; else it is killed, and the log says what differed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import stat
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from osmosis.eval.model.bridge_address import LISTEN_BACKLOG
from osmosis.eval.results.redact import Redactor
from osmosis.eval.results.trial_outputs import (
    DEFAULT_ARTIFACT_LIMITS,
    SKIPPED_NOTES,
    ArtifactLimits,
    copy_artifacts,
    write_trial_json,
)
from osmosis.eval.sites.api import (
    Lease,
    ResourceLimitBreach,
    ResultWithBreach,
    RolloutAPI,
    RolloutServerUnavailable,
)
from osmosis.eval.sites.environment import RolloutEnvironment
from osmosis.eval.sites.local import (
    DEFAULT_MAX_RESTARTS,
    LocalEndpoint,
    LocalProcessSite,
    capacity_of,
)
from osmosis.eval.sites.rollout_client import RolloutClient
from osmosis.eval.sites.rollout_process import (
    DEFAULT_STARTUP_TIMEOUT_SEC,
    RolloutProcess,
    RolloutStartError,
)
from osmosis.eval.sites.sandbox import disk, spare
from osmosis.eval.sites.sandbox.environment import clean_base_env
from osmosis.eval.sites.sandbox.launcher import (
    SHIM_SOURCE,
    Launcher,
    SandboxPlace,
    outbox_for,
    prepare_site,
    sweep_site_dirs,
    terminate_shim,
)
from osmosis.eval.sites.sandbox.layout import (
    HANDOFF_SOCKET,
    SANDBOX_HOME,
    compile_shim,
    runs_our_bytecode,
    shim_bytecode,
)
from osmosis.eval.sites.sandbox.limits import LimitGroup, create_limit_group
from osmosis.eval.sites.sandbox.network import BridgeForwarder, Slirp
from osmosis.eval.sites.sandbox.policy import MAX_TRIAL_ENTRIES, SandboxLimits, SandboxPolicy
from osmosis.eval.sites.sandbox.spare import Spare
from osmosis.eval.sites.sandbox.support import SandboxSupport, known_support, probe_sandbox
from osmosis.eval.sites.seam import Endpoint
from osmosis.rollout.protocol import RolloutInitRequest, RolloutResultResponse
from osmosis.rollout.types import RolloutStatus
from osmosis.vocabulary import format_bytes

MAX_LIMIT_RESTARTS = 100
"""Restarts after a resource limit a site grants in all (they do not use the budget)."""

_WATCH_SEC = 0.2
_DISK_EVERY = 5  # the disk is measured every fifth round of the watcher: once a second
_SETTLE_SEC = 1.0  # how long an ended attempt's leftover process may hold its files
_INLINE_WALK = 64  # entries a measure may look at on the event loop: ~0.1 ms of it
_TRIAL_NAMES = ("trajectory.json", "diagnostics.json", "artifacts")
_TRIAL_DOCUMENT_BYTES = 64 * 1024 * 1024  # what the run reads of trajectory.json at most


class SandboxEndpoint(LocalEndpoint):
    """One sandboxed rollout server: its process, its cgroup, its socket, its verdicts, and
    the disk it holds (see `osmosis.eval.sites.sandbox.disk`)."""

    def __init__(
        self,
        name: str,
        process: RolloutProcess,
        client: RolloutClient,
        *,
        capacity: int | None,
        trials_root: Path,
        outbox: Path,
        ended: Path,
        claimed: set[str],
        group: LimitGroup,
        slirp: Slirp | None,
        socket_path: Path,
        trial_limits: ArtifactLimits = DEFAULT_ARTIFACT_LIMITS,
        log: Callable[[str], None] = lambda _line: None,
    ) -> None:
        super().__init__(name, process, client, capacity=capacity, trials_root=trials_root)
        self.outbox = outbox
        self.ended = ended
        """This server's attempts that ended, out of the sandbox's reach until let go."""
        self._ended_made = False  # until the first `_retire`, `ended` does not exist
        self.group = group
        self.slirp = slirp
        self.socket_path = socket_path
        self.limit_hit: str | None = None
        """Which limit killed the server, in words; None while it has not."""
        self.disk_quota = group.limits.disk_quota(capacity)
        """Bytes this server may hold at once (`SandboxLimits.disk_bytes`)."""
        self.running: set[str] = set()
        """Rollout ids started here whose directory is still in the outbox."""
        self._claimed = claimed  # every endpoint's `running`, the site's: the rest is stray
        self._awaiting: set[str] = set()  # ended, not yet taken by `trial()`
        self._dropped: set[str] = set()  # ended over a limit: nothing of them is kept
        self._retired: set[str] = set()  # ended, its directory moved to `ended`
        self._unheld: set[str] = set()  # retired, and no process held any of it then
        self._unsettled: list[_Ended] = []  # ended, waiting for the next settling round
        self._settler: asyncio.Task[None] | None = None
        self._lingering: set[asyncio.Task[None]] = set()  # ended, still held: settled alone
        self._last = disk.DiskUse()
        self._tmpfs: list[int] | None = None  # its /tmp and HOME, held open (`disk.open_tmpfs`)
        self._tmpfs_lock = threading.Lock()  # opened once, by the loop or a thread
        # The outbox held open for the measures on the loop (`finish`); closed by `stop`.
        self._listing: disk.HeldDirectory | None = None
        with contextlib.suppress(OSError):
            self._listing = disk.HeldDirectory(outbox)
        self._walked = 0  # entries the last measure looked at: few, and the next may be inline
        self._log = log
        self._trial_limits = trial_limits
        self._dead = asyncio.Event()
        self._api = _LimitedAPI(client, self)
        self._watcher = asyncio.create_task(self._watch(), name=f"sandbox-watch-{name}")

    @property
    def api(self) -> RolloutAPI:
        return self._api

    @property
    def dead(self) -> asyncio.Event:
        return self._dead

    @property
    def death_reason(self) -> str:
        breach = self.breach
        return str(breach) if breach is not None else self.process.exit_reason

    @property
    def breach(self) -> ResourceLimitBreach | None:
        if self.limit_hit is None:
            return None
        return ResourceLimitBreach(f"rollout server {self.name!r}", self.limit_hit)

    # -- attempts ----------------------------------------------------------------------------
    def claim(self, rollout_id: str) -> None:
        """The attempt is about to start here: its outbox entry counts as this server's."""
        self.running.add(rollout_id)
        self._claimed.add(rollout_id)

    async def finish(self, rollout_id: str, result: RolloutResultResponse) -> RolloutResultResponse:
        """The attempt ended: retire its directory, judge it, and judge the server's disk.

        Over the attempt's own limits: a `ResultWithBreach` (nothing of it is kept). The
        server past its disk quota: it is ended as the watcher would (`RolloutServerUnavailable`
        here; the engine charges the attempt alone on it)."""
        try:
            # Most attempts leave no directory: nothing to retire, judge or wait for, and the
            # server's disk is measured here (a few system calls while the last measure walked
            # few entries): a hop to a thread cost more than the measure. The same listing of
            # the outbox says whether the attempt left one.
            use = None
            if self._walked <= _INLINE_WALK:
                use = self._measure(walk_running=False, find=rollout_id, listing=self._listing)
            if use is None or use.found:
                verdict, over = await self._settled(rollout_id, result)
            else:
                verdict = self._verdict(None, result)
                over = self._over_quota_after(rollout_id, use)
        finally:
            self.running.discard(rollout_id)
            self._claimed.discard(rollout_id)
        if verdict is not None and over is None and self.limit_hit is None:
            held = await asyncio.to_thread(disk.held, self.ended / rollout_id, self._pids())
            if held:
                # A process of the sandbox still writes into the attempt's files: the server
                # ends too, or those writes would be charged to the next attempt on it.
                over = f"{verdict}; a process of the sandbox was still writing into it"
        if over is not None and self.limit_hit is None:
            self.limit_hit = over
            await self._end_for_limit()
        if self.limit_hit is not None:
            raise RolloutServerUnavailable(
                f"rollout server {self.name!r} was stopped: {self.limit_hit}"
            )
        if verdict is None:
            return result
        self._dropped.add(rollout_id)
        breach = ResourceLimitBreach("the attempt", verdict)
        return ResultWithBreach(
            rollout_id=rollout_id,
            status=RolloutStatus.FAILURE,
            err_message=str(breach),
            breach=breach,
        )

    async def _settled(
        self, rollout_id: str, result: RolloutResultResponse
    ) -> tuple[str | None, str | None]:
        """The attempt's verdict and the server's disk verdict, from the next settling round
        (`_settle_ended`)."""
        self._awaiting.add(rollout_id)  # before the rename: the watcher must not let it go
        ended = _Ended(rollout_id, result, asyncio.get_running_loop().create_future())
        self._unsettled.append(ended)
        if self._settler is None:
            self._settler = asyncio.create_task(self._settle_ended(), name=f"settle-{self.name}")
        return await ended.verdicts

    def _over_quota_after(self, rollout_id: str, use: disk.DiskUse | None = None) -> str | None:
        """The server's disk verdict once an attempt ended (out of the outbox by now): a measure
        now (or `use`, taken since), and the other attempts in flight as the watcher last
        found them."""
        if use is None:
            use = self._measure(walk_running=False)
        others = sum(t.bytes for i, t in self._last.attempts.items() if i != rollout_id)
        return self._over_quota(use.total + others)

    async def discard(self, rollout_ids: Sequence[str]) -> None:
        """Attempts cancelled here: nothing of them is kept, their space comes back."""
        ids = [i for i in rollout_ids if i in self.running]
        if not ids:
            return
        await asyncio.to_thread(self._retire_all, ids)
        for rollout_id in ids:
            self.running.discard(rollout_id)
            self._claimed.discard(rollout_id)

    def _retire_all(self, rollout_ids: Sequence[str]) -> None:
        for rollout_id in rollout_ids:
            if self._retire(rollout_id):
                self._let_go(self.ended / rollout_id)

    def _retire(self, rollout_id: str) -> bool:
        """`disk.retire` the attempt's directory into `ended` (made at the first)."""
        self._ended_made = True
        return disk.retire(self.outbox / rollout_id, self.ended / rollout_id)

    async def _settle_ended(self) -> None:
        """Settle the attempts that ended leaving a directory, in rounds: each round takes
        every such attempt that ended meanwhile, in one thread, with one read of the server's
        processes and one measure of its disk for all of them (`_settle`). An attempt whose
        files a process still holds is settled on its own (`_settle_held`), so its wait holds
        up no other."""
        batch: list[_Ended] = []
        try:
            while self._unsettled:
                batch, self._unsettled = self._unsettled, []
                try:
                    settled = await asyncio.to_thread(self._settle, batch)
                except Exception as error:
                    for ended in batch:
                        if not ended.verdicts.done():
                            ended.verdicts.set_exception(error)
                    continue
                for ended, verdicts in zip(batch, settled, strict=True):
                    if verdicts is None:
                        task = asyncio.create_task(self._settle_alone(ended))
                        self._lingering.add(task)
                        task.add_done_callback(self._lingering.discard)
                    elif not ended.verdicts.done():
                        ended.verdicts.set_result(verdicts)
                batch = []
        finally:
            self._settler = None
            for ended in (*batch, *self._unsettled):  # cancelled: no attempt waits forever
                ended.verdicts.cancel()
            self._unsettled.clear()

    async def _settle_alone(self, ended: _Ended) -> None:
        try:
            verdicts = await asyncio.to_thread(self._settle_held, ended.rollout_id, ended.result)
        except asyncio.CancelledError:
            ended.verdicts.cancel()
            raise
        except Exception as error:
            if not ended.verdicts.done():
                ended.verdicts.set_exception(error)
            return
        if not ended.verdicts.done():
            ended.verdicts.set_result(verdicts)

    def _settle(self, batch: Sequence[_Ended]) -> list[tuple[str | None, str | None] | None]:
        """Retire each attempt's directory and judge it and the server's disk after it, as
        `_settle_held` does for one; None for an attempt a process of the sandbox still holds
        some of (`_settle_held` takes it). One read of the processes and one measure of the
        disk serve the whole batch: each attempt's verdict still comes from a measure taken
        after its own directory was retired."""
        limits = self.group.limits
        usage: dict[str, str | None] = {}
        fine: list[Path] = []  # retired within its limits: is a process still in it?
        # One listing for the batch: most attempts leave no directory, and need no lstat.
        try:
            present: set[str] | None = set(_names(self.outbox, strict=True))
        except OSError:
            present = None  # unreadable: try each attempt's directory, as `retire` does
        for ended in batch:
            if present is not None and ended.rollout_id not in present:
                continue
            directory = self.ended / ended.rollout_id
            if self._retire(ended.rollout_id):
                self._retired.add(ended.rollout_id)
                usage[ended.rollout_id] = found = disk.attempt_usage(directory, limits)
                if found is None:
                    fine.append(directory)
        pids = self._pids() if fine else []
        held = {path.name for path in disk.held_among(fine, pids)}
        # Out of the sandbox's reach once retired, a directory no process holds now is held
        # by none later: `_let_go` need not look again.
        self._unheld.update(path.name for path in fine if path.name not in held)
        judged = {
            ended.rollout_id: self._verdict(usage.get(ended.rollout_id), ended.result)
            for ended in batch
            if ended.rollout_id not in held
        }
        if not judged:
            return [None] * len(batch)
        use = self._measure(walk_running=False)
        # The batch's attempts are in `ended` now, measured there: not in flight as well.
        batch_ids = {ended.rollout_id for ended in batch}
        others = sum(t.bytes for i, t in self._last.attempts.items() if i not in batch_ids)
        over = self._over_quota(use.total + others)
        return [
            (judged[ended.rollout_id], over) if ended.rollout_id in judged else None
            for ended in batch
        ]

    def _settle_held(
        self, rollout_id: str, result: RolloutResultResponse
    ) -> tuple[str | None, str | None]:
        """Retire the attempt's directory; wait up to `_SETTLE_SEC` while a process of the
        sandbox still holds some of it (its writes count against the attempt meanwhile).
        Returns the attempt's verdict and the server's disk verdict."""
        directory = self.ended / rollout_id
        if self._retire(rollout_id):
            self._retired.add(rollout_id)
        if rollout_id in self._retired:
            give_up = time.monotonic() + _SETTLE_SEC
            while (
                disk.attempt_usage(directory, self.group.limits) is None
                and time.monotonic() < give_up
                and disk.held(directory, self._pids())
            ):
                time.sleep(0.1)
        return self.attempt_verdict(rollout_id, result), self._over_quota_after(rollout_id)

    def attempt_verdict(self, rollout_id: str, result: RolloutResultResponse) -> str | None:
        """The limit a finished attempt exceeded, in words; None when it stayed within."""
        return self._verdict(disk.attempt_usage(self.ended / rollout_id, self.group.limits), result)

    def _verdict(self, usage: str | None, result: RolloutResultResponse) -> str | None:
        """`attempt_verdict`, given what `disk.attempt_usage` said of the attempt's files."""
        if usage is not None:
            return usage
        limits = self.group.limits
        message = result.err_message or ""
        if (
            not self.group.is_cgroup
            and result.status is not RolloutStatus.SUCCESS
            and "MemoryError" in message
        ):
            return f"memory limit ({limits.memory_bytes} bytes of address space): MemoryError"
        return None

    async def trial(self, rollout_id: str) -> Path | None:
        try:
            # Most attempts leave no directory (no artifacts, the trajectory sent with the
            # result): then there is nothing to copy or let go, and no thread to wait for.
            if rollout_id not in self._retired:
                return None
            return await asyncio.to_thread(self._take_trial, rollout_id)
        finally:
            self._awaiting.discard(rollout_id)
            self._dropped.discard(rollout_id)
            self._retired.discard(rollout_id)
            self._unheld.discard(rollout_id)

    def _take_trial(self, rollout_id: str) -> Path | None:
        """Copy what the engine reads out of the ended attempt (see the module docstring);
        an attempt over a limit, or on a server a limit ended, keeps nothing."""
        source = self.ended / rollout_id
        unheld = rollout_id in self._unheld
        if rollout_id in self._dropped or self.limit_hit is not None:
            self._let_go(source, unheld=unheld)
            return None
        try:
            if not stat.S_ISDIR(os.lstat(source).st_mode):
                return None
        except OSError:
            return None
        dest = self._trials_root / rollout_id
        copied = copy_artifacts(
            source,
            dest,
            redact=_unchanged,  # the run's copy redacts (`host.run_dir`)
            limits=self._trial_limits,
            names=_TRIAL_NAMES,
            keep_source=True,
        )
        # The run's own copy names what was left out, under the attempt's row and run index.
        skipped = [
            [item.path.removeprefix("artifacts/"), item.reason]
            for item in copied.skipped
            if item.path.startswith("artifacts/")
        ]
        if skipped:
            write_trial_json(dest, SKIPPED_NOTES, skipped)
        if (note := copied.summary()) is not None and len(skipped) < len(copied.skipped):
            self._log(f"trial {rollout_id}: {note}")
        self._let_go(source, unheld=unheld)
        return dest

    def _let_go(self, directory: Path, *, unheld: bool = False) -> None:
        """Empty an ended attempt's directory, and remove it unless a process holds it (the
        watcher removes it once none does; stopping the server at the latest). `unheld`: no
        process held it once it was retired, so none can now."""
        disk.empty(directory)
        if unheld or not disk.held(directory, self._pids()):
            disk.remove(directory)

    # -- the watcher -------------------------------------------------------------------------
    async def _watch(self) -> None:
        exited = self.process.exited
        rounds = 0
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(exited.wait(), _WATCH_SEC)
            rounds += 1
            if self.limit_hit is None:
                self.limit_hit = await asyncio.to_thread(self.group.exceeded)
                if self.limit_hit is None and exited.is_set():
                    self.limit_hit = _rlimit_death(self.process.returncode, self.group.limits)
            if self.limit_hit is None and not exited.is_set() and rounds % _DISK_EVERY == 0:
                self.limit_hit = await asyncio.to_thread(self._disk_hit)
            if self.limit_hit is not None and not exited.is_set():
                await self._end_for_limit()
            if exited.is_set():
                self._dead.set()
                return

    async def _end_for_limit(self) -> None:
        # Dead first: the engine sorts the attempts in flight before the kill drops their
        # connections (the charged one is then recorded, not requeued).
        self._dead.set()
        await asyncio.sleep(0)
        await asyncio.to_thread(self.group.kill)
        await self.process.stop(grace=0)

    def _disk_hit(self) -> str | None:
        """The disk limit the server is past now, in words; None within (module docstring
        of `disk`). Lets go of ended attempts no process holds any longer."""
        use = self._last = self._measure(walk_running=True)
        limits = self.group.limits
        for found in use.attempts.values():
            if found.entries > MAX_TRIAL_ENTRIES:
                return f"limit of {MAX_TRIAL_ENTRIES} files and directories (an attempt in flight)"
            if found.bytes > limits.artifact_bytes:
                return (
                    f"output limit ({limits.artifact_bytes} bytes per attempt): an attempt in "
                    "flight wrote more"
                )
        if use.stray.entries > MAX_TRIAL_ENTRIES:
            return f"limit of {MAX_TRIAL_ENTRIES} files and directories (outside any attempt)"
        lingering = [n for n in _names(self.ended) if n not in self._awaiting]
        if lingering:
            pids = self._pids()
            for name in lingering:
                if name not in self._awaiting and not disk.held(self.ended / name, pids):
                    disk.remove(self.ended / name)
        return self._over_quota(use.total)

    def _measure(
        self,
        *,
        walk_running: bool,
        find: str | None = None,
        listing: disk.HeldDirectory | None = None,
    ) -> disk.DiskUse:
        use = disk.measure(
            self.outbox,
            self.ended if self._ended_made else None,
            running=self.running if walk_running else (),
            claimed=self._claimed,
            tmpfs=self._tmpfs_handles(),
            cap=MAX_TRIAL_ENTRIES,
            find=find,
            listing=listing,
        )
        self._walked = use.walked
        return use

    def _tmpfs_handles(self) -> list[int]:
        """The sandbox's `/tmp` and `HOME` (`disk.open_tmpfs`), opened at the first measure
        that finds a process of its mount namespace; none before (nothing to count yet)."""
        if self._tmpfs is not None:
            return self._tmpfs
        with self._tmpfs_lock:
            if self._tmpfs is None:
                handles = disk.open_tmpfs(disk.mount_pid(self._pids()))
                if handles:
                    self._tmpfs = handles
            return self._tmpfs or []

    def _over_quota(self, total: int) -> str | None:
        if total <= self.disk_quota:
            return None
        return (
            f"disk quota ({format_bytes(self.disk_quota, exact=True)} per rollout server: "
            f"its attempts' outputs, the outbox, /tmp and HOME): it held {format_bytes(total)}"
        )

    def _pids(self) -> list[int]:
        return self.group.pids(self.process.pid)

    # -- stopping ----------------------------------------------------------------------------
    async def stop(self) -> None:
        self._watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._watcher
        for task in (self._settler, *self._lingering):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        try:
            await super().stop()
        finally:
            listing, self._listing = self._listing, None  # here, on the loop that lists it
            if listing is not None:
                listing.close()
            await asyncio.to_thread(self._release)
            for rollout_id in self.running:
                self._claimed.discard(rollout_id)
            self.running.clear()

    def _release(self) -> None:
        """After the server: its processes, cgroup, network, socket, and the disk it held
        (its attempts' directories, the ended ones, what no attempt claims in the outbox)."""
        self.group.kill()
        self.group.remove()
        with self._tmpfs_lock:
            for handle in self._tmpfs or ():
                os.close(handle)
            self._tmpfs = None
        if self.slirp is not None:
            self.slirp.stop()
        with contextlib.suppress(OSError):
            self.socket_path.unlink()
        for rollout_id in list(self.running):
            disk.remove(self.outbox / rollout_id)
        for name in _names(self.outbox):
            if name not in self._claimed:
                disk.remove(self.outbox / name)
        disk.remove(self.ended)


@dataclass(frozen=True)
class _Ended:
    """An attempt that ended, waiting to be settled (`SandboxEndpoint._settle_ended`)."""

    rollout_id: str
    result: RolloutResultResponse
    verdicts: asyncio.Future[tuple[str | None, str | None]]
    """The attempt's verdict and the server's disk verdict, once settled."""


class _LimitedAPI:
    """The endpoint's `RolloutClient`, with each attempt's outbox entry claimed before it
    starts and each finished attempt judged by the endpoint (`SandboxEndpoint.finish`)."""

    def __init__(self, client: RolloutClient, endpoint: SandboxEndpoint) -> None:
        self._client = client
        self._endpoint = endpoint

    async def health(self) -> dict[str, object]:
        return await self._client.health()

    async def start(self, request: RolloutInitRequest) -> Lease:
        self._endpoint.claim(request.rollout_id)
        try:
            return await self._client.start(request)
        except BaseException:
            await asyncio.shield(self._endpoint.discard([request.rollout_id]))
            raise

    async def wait(
        self, lease: Lease, *, deadline_sec: float | None = None
    ) -> RolloutResultResponse:
        result = await self._client.wait(lease, deadline_sec=deadline_sec)
        return await self._endpoint.finish(lease.rollout_id, result)

    async def cancel(self, rollout_ids: list[str]) -> dict[str, str]:
        try:
            return await self._client.cancel(rollout_ids)
        finally:
            await self._endpoint.discard(rollout_ids)

    async def aclose(self) -> None:
        await self._client.aclose()


class SandboxSite(LocalProcessSite):
    """Starts N sandboxed rollout servers, replaces dead ones, stops them all."""

    def __init__(
        self,
        environment: RolloutEnvironment,
        rollout_dir: Path,
        entrypoint: str | Path,
        *,
        env: Mapping[str, str],
        trials_root: Path,
        log: Callable[[str], None],
        redactor: Redactor,
        policy: SandboxPolicy,
        workspace: Path,
        bridge_url: str,
        bridge_address: tuple[str, int],
        hidden: Sequence[Path] = (),
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        startup_timeout: float = DEFAULT_STARTUP_TIMEOUT_SEC,
        base_env: Mapping[str, str] | None = None,
        artifact_limits: ArtifactLimits = DEFAULT_ARTIFACT_LIMITS,
        on_spawned: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(
            environment,
            rollout_dir,
            entrypoint,
            env=env,
            trials_root=trials_root,
            log=log,
            redactor=redactor,
            max_restarts=max_restarts,
            startup_timeout=startup_timeout,
            base_env=clean_base_env(os.environ, home=SANDBOX_HOME)
            if base_env is None
            else base_env,
            on_spawned=on_spawned,
        )
        port = urlsplit(bridge_url).port
        if port is None:
            raise ValueError(f"the bridge URL {bridge_url!r} names no port")
        self.policy = policy
        self.workspace = workspace.resolve()
        self.bridge_port = port
        self.bridge_address = bridge_address
        self.hidden = tuple(hidden)
        self.outbox = outbox_for(trials_root)
        self.ended = trials_root.parent / f"{trials_root.name}{disk.ENDED_SUFFIX}"
        """Each server's attempts that ended, out of the sandbox's reach (`disk`)."""
        # What `trial()` copies of an attempt: the run's artifact limits, and the two
        # documents (as the Ray site ships them).
        self.trial_limits = ArtifactLimits(
            max_files=artifact_limits.max_files + 2,
            max_file_bytes=max(artifact_limits.max_file_bytes, _TRIAL_DOCUMENT_BYTES),
            max_total_bytes=artifact_limits.max_total_bytes + 2 * _TRIAL_DOCUMENT_BYTES,
        )
        self._claimed: set[str] = set()  # every server's attempts in flight
        self.support: SandboxSupport | None = None
        self._site_dir: Path | None = None
        self._shim = SHIM_SOURCE  # or its bytecode in the site's directory (`compile_shim`)
        self._forwarder: BridgeForwarder | None = None
        self._described = False
        self._limit_restarts = 0
        self._spare: Spare | None = None  # a server started ahead, adopted by `_launch`

    async def start(self, replicas: int | None = 1) -> None:
        """Check the sandbox works here (`SandboxUnavailable` otherwise), prepare the site's
        directory and the bridge's socket, then start the servers as the local site does;
        the first is the spare this process holds (`sandbox.spare`) when it is the server this
        site would start."""
        python = self.environment.python
        # The probe's answer, waited for off the loop (~10-50 ms) unless it is kept: a spare
        # may have started before it (`launcher.start_spare`), and is checked against it.
        probed = known_support(self.policy.bwrap)
        if probed is None:
            probed = await asyncio.to_thread(probe_sandbox, self.policy.bwrap)
        self.support = probed
        self._spare = await self._fitting_spare(probed)
        # On the loop: a few milliseconds of file-system calls. In a thread, each call gives
        # up the GIL and waits to take it back from this busy thread (~30 ms in all, under
        # the run's start), and the shim's compiling holds it either way.
        try:
            support = self._prepare()
            if runs_our_bytecode(python):
                shim_bytecode(SHIM_SOURCE)  # once per process
        except BaseException:
            if self._site_dir is not None:
                await self._close()
            raise
        site_dir = self._site_dir
        assert site_dir is not None
        self.log(
            f"sandbox: {support.version or 'bwrap'} ({support.bwrap}), network "
            f"{self.policy.network}: the rollout reaches the model bridge"
            + (
                " and the internet, never the host's loopback"
                if self.policy.network == "full"
                else " and nothing else"
            )
        )
        try:
            if self._spare is not None:
                self._shim = self._spare.shim  # the bytes its shim runs: left as they are
            else:
                self._shim = compile_shim(SHIM_SOURCE, python, site_dir / "shim.pyc")
            host, port = self.bridge_address
            self._forwarder = await BridgeForwarder.start(
                site_dir / "bridge" / Path(HANDOFF_SOCKET).name, host, port
            )
            await super().start(replicas)
        except BaseException:
            await self._close()
            raise

    async def _fitting_spare(self, support: SandboxSupport) -> Spare | None:
        """The spare this process holds, when it is the server this site would start first;
        killed (and the log says what differs) otherwise. None when there is none."""
        found = spare.claim()
        if found is None:
            return None
        differs = found.difference(self, support)
        if differs is None:
            return found
        await asyncio.to_thread(found.kill)
        self.log(f"rollout server: the spare was not adopted: it differs in {differs}")
        return None

    def _prepare(self) -> SandboxSupport:
        """Check bwrap (`SandboxUnavailable`), clear what killed engines left, and make the
        site's directory (0700: ours only) with its `/etc` files, and the outbox; with a
        spare, take its directory and rename its outbox to this site's."""
        support = self.support
        assert support is not None, "start() probes first"
        if self._spare is not None:
            sweep_site_dirs()
            # A spare started for this very outbox (`eval run --sandbox`, at the command's
            # entry) cleared what a killed engine left there before it made it.
            moved = self._spare.outbox != self.outbox.resolve()
            if moved:
                disk.remove_stale(self.trials_root)
            try:
                if moved:
                    self.outbox.parent.mkdir(parents=True, exist_ok=True)
                    os.rename(self._spare.outbox, self.outbox)
            except OSError as error:  # another file system, say: the run starts its own
                self._spare.kill()
                self._spare = None
                self.log(f"rollout server: the spare was not adopted: its outbox: {error}")
            else:
                self._site_dir = self._spare.site_dir
                return support
        support.require()
        self._site_dir = prepare_site(self.policy, self.trials_root, self.outbox)
        return support

    async def stop(self) -> None:
        try:
            await super().stop()
        finally:
            await self._close()

    async def _close(self) -> None:
        forwarder, self._forwarder = self._forwarder, None
        if forwarder is not None:
            await forwarder.stop()
        site_dir, self._site_dir = self._site_dir, None
        if site_dir is not None:
            await asyncio.to_thread(shutil.rmtree, site_dir, True)
        await asyncio.to_thread(disk.remove_stale, self.trials_root)

    def _free_restart(self, endpoint: Endpoint) -> str | None:
        if (
            isinstance(endpoint, SandboxEndpoint)
            and endpoint.limit_hit is not None
            and self._limit_restarts < MAX_LIMIT_RESTARTS
        ):
            self._limit_restarts += 1
            return "after a resource limit; not counted as a restart"
        return None

    async def _launch(self, name: str) -> LocalEndpoint:
        assert self._site_dir is not None and self.support is not None, "start() first"
        found, self._spare = self._spare, None
        if found is not None:
            adopted = await self._adopt_spare(name, found)
            if adopted is not None:
                return adopted
        group = create_limit_group(name, self.policy.limits)  # a few calls: see `start`
        if not self._described:
            self._described = True
            self.log(f"sandbox {group.describe()}")
        socket_path = self._site_dir / f"{name[:40]}-{uuid.uuid4().hex[:8]}.sock"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        launcher = Launcher(self._place(), group, listener, socket_path)
        try:
            listener.bind(str(socket_path))
            listener.listen(LISTEN_BACKLOG)  # the shim serves it with the same backlog
            process = await RolloutProcess.start(
                self.environment,
                self.rollout_dir,
                self.entrypoint,
                env=self.env,
                artifact_root=self.outbox,
                log=self.log,
                redactor=self.redactor,
                startup_timeout=self.startup_timeout,
                name=name,
                base_env=self.base_env,
                wrap=launcher.wrap,
                spawned=self.on_spawned,
            )
        except RolloutStartError as error:
            hit = group.exceeded()
            launcher.release()
            _release_group(group, socket_path)
            if hit is None:
                raise
            breach = ResourceLimitBreach(f"rollout {name!r}", hit)
            raise RolloutStartError(
                f"{breach} while starting",
                returncode=error.returncode,
                output=error.output_tail,
            ) from None
        except BaseException:
            launcher.release()
            _release_group(group, socket_path)
            raise
        finally:
            listener.close()  # the shim holds its own copy; ours would queue dead connections
        client = RolloutClient("http://rollout", unix_socket=socket_path, handoff=True)
        try:
            capacity = capacity_of(await client.health())
        except BaseException:
            with contextlib.suppress(Exception):
                await client.aclose()
            await process.stop()
            launcher.release()
            _release_group(group, socket_path)
            raise
        return SandboxEndpoint(
            name,
            process,
            client,
            capacity=capacity,
            trials_root=self.trials_root,
            outbox=self.outbox,
            ended=self.ended / socket_path.stem,
            claimed=self._claimed,
            group=group,
            slirp=launcher.slirp,
            socket_path=socket_path,
            trial_limits=self.trial_limits,
            log=self.log,
        )

    def _place(self) -> SandboxPlace:
        assert self._site_dir is not None and self.support is not None, "start() first"
        return SandboxPlace(
            support=self.support,
            site_dir=self._site_dir,
            shim=self._shim,
            policy=self.policy,
            venv=self.environment.venv,
            workspace=self.workspace,
            outbox=self.outbox,
            hidden=self.hidden,
            bridge_port=self.bridge_port,
        )

    async def _adopt_spare(self, name: str, found: Spare) -> SandboxEndpoint | None:
        """The spare as this site's endpoint `name`, once it answers; None (it is killed, and
        the log says why) when it does not."""
        process: RolloutProcess | None = None
        client = RolloutClient("http://rollout", unix_socket=found.socket_path, handoff=True)
        self.on_spawned()
        try:
            process = await RolloutProcess.adopt(
                found.early.popen,
                name=name,
                port=found.early.port,
                instance_id=found.early.instance_id,
                ready_fd=found.early.ready_fd,
                log=self.log,
                redactor=self.redactor,
                startup_timeout=self.startup_timeout,
                socket_path=found.socket_path,
                terminate=terminate_shim,
            )
            capacity = capacity_of(await client.health())
        except Exception as error:
            with contextlib.suppress(Exception):
                await client.aclose()
            if process is not None:
                await process.stop()
            await asyncio.to_thread(_release_group, found.group, found.socket_path)
            if found.slirp is not None:
                found.slirp.stop()
            self.log(f"rollout server: the spare was not adopted: {error}")
            return None
        self.log(f"rollout server {name}: adopted the spare started {found.age:.1f} s ago")
        return SandboxEndpoint(
            name,
            process,
            client,
            capacity=capacity,
            trials_root=self.trials_root,
            outbox=self.outbox,
            ended=self.ended / found.socket_path.stem,
            claimed=self._claimed,
            group=found.group,
            slirp=found.slirp,
            socket_path=found.socket_path,
            trial_limits=self.trial_limits,
            log=self.log,
        )


def _names(directory: Path, *, strict: bool = False) -> list[str]:
    """The names in `directory`; none when it cannot be read (`strict`: the `OSError`)."""
    try:
        with os.scandir(directory) as entries:
            return [entry.name for entry in entries]
    except OSError:
        if strict:
            raise
        return []


def _unchanged(text: str) -> str:
    return text


def _rlimit_death(returncode: int | None, limits: SandboxLimits) -> str | None:
    """A server the kernel killed for CPU time (SIGXCPU: the shim exits 128 + 24)."""
    if returncode is not None and returncode in (128 + 24, -24) and limits.cpu_seconds:
        return f"CPU time limit ({limits.cpu_seconds} s per process)"
    return None


def _release_group(group: LimitGroup, socket_path: Path) -> None:
    group.kill()
    group.remove()
    with contextlib.suppress(OSError):
        socket_path.unlink()


__all__ = ["MAX_LIMIT_RESTARTS", "SandboxEndpoint", "SandboxSite"]
