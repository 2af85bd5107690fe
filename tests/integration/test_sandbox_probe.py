"""The sandbox probe's answer is kept only while it is still true of the binary (issue 30): a
working answer while the binary is the same file, unchanged; a failed one never. A probe
started ahead (`probe_soon`) is the one a later caller waits for, and an environment build's
jail, not its construction, says when the sandbox cannot run. Real bwrap behind a script that
can be told to fail."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from osmosis.eval.sites.sandbox import SandboxPolicy
from osmosis.eval.sites.sandbox.build import BuildSandbox
from osmosis.eval.sites.sandbox.support import (
    SandboxUnavailable,
    find_bwrap,
    probe_sandbox,
    probe_soon,
)

FAIL = "bwrap: No permissions to create new namespace"


def gated_bwrap(path: Path, gate: Path, calls: Path, *, slow: float = 0) -> None:
    """A bwrap that notes each call in `calls`, and is the real one while `gate` exists
    (else it fails as bwrap does on a kernel without unprivileged user namespaces); `slow`:
    seconds its `--version` takes."""
    real = find_bwrap()
    assert real is not None, "the tests need a bwrap binary"
    path.write_text(
        f'#!/bin/sh\necho "$1" >> {calls}\n'
        f'if [ "$1" = --version ]; then sleep {slow}; fi\n'
        f'if [ -e {gate} ]; then exec {real} "$@"; fi\necho "{FAIL}" >&2\nexit 1\n'
    )
    path.chmod(0o755)


def probes(calls: Path) -> int:
    return calls.read_text().splitlines().count("--version") if calls.exists() else 0


def test_a_failed_probe_is_asked_again_and_a_working_one_is_kept(tmp_path):
    """Unavailable, then fixed (the operator allowed the namespaces): the next call sees the
    fix. Working: kept, not re-run, even once the kernel would refuse again (the launch
    itself then fails, closed)."""
    bwrap, gate, calls = tmp_path / "bwrap", tmp_path / "gate", tmp_path / "calls"
    gated_bwrap(bwrap, gate, calls)
    refused = probe_sandbox(bwrap)
    assert not refused.available and refused.reason is not None and FAIL in refused.reason
    assert probes(calls) == 1
    gate.touch()
    assert probe_sandbox(bwrap).available
    assert probes(calls) == 2
    gate.unlink()
    assert probe_sandbox(bwrap).available
    assert probes(calls) == 2


def test_a_replaced_or_rewritten_binary_is_probed_again(tmp_path):
    bwrap, gate, calls = tmp_path / "bwrap", tmp_path / "gate", tmp_path / "calls"
    gate.touch()
    gated_bwrap(bwrap, gate, calls)
    assert probe_sandbox(bwrap).available
    assert probe_sandbox(bwrap).available and probes(calls) == 1
    # Another file at the same path (a package upgrade renames its new binary over the old).
    fresh = tmp_path / "bwrap.new"
    gated_bwrap(fresh, gate, calls)
    os.replace(fresh, bwrap)
    assert probe_sandbox(bwrap).available and probes(calls) == 2
    # The same file rewritten in place: its size and times change.
    bwrap.write_text(f'#!/bin/sh\necho "$1" >> {calls}\necho "{FAIL}" >&2\nexit 1\n')
    rewritten = probe_sandbox(bwrap)
    assert not rewritten.available and probes(calls) == 3


def test_a_probe_started_ahead_is_the_one_a_later_caller_waits_for(tmp_path):
    bwrap, gate, calls = tmp_path / "bwrap", tmp_path / "gate", tmp_path / "calls"
    gate.touch()
    gated_bwrap(bwrap, gate, calls, slow=0.5)
    probe_soon(bwrap)
    deadline = time.monotonic() + 10
    while probes(calls) == 0:  # the probe ahead is under way
        assert time.monotonic() < deadline, "probe_soon did not probe"
        time.sleep(0.01)
    assert probe_sandbox(bwrap).available
    assert probes(calls) == 1


def test_a_probe_started_ahead_runs_its_version_and_trial_at_once(tmp_path):
    """`probe_soon` starts both of the probe's processes from the caller's thread: the trial
    does not wait for `--version` (nor for this process's GIL between the two)."""
    bwrap, gate, calls = tmp_path / "bwrap", tmp_path / "gate", tmp_path / "calls"
    gate.touch()
    gated_bwrap(bwrap, gate, calls, slow=3)
    began = time.monotonic()
    probe_soon(bwrap)
    while len(calls.read_text().splitlines() if calls.exists() else []) < 2:
        assert time.monotonic() < began + 10, "the trial did not start"
        time.sleep(0.01)
    assert time.monotonic() - began < 3  # while --version still sleeps
    assert probe_sandbox(bwrap).available and probes(calls) == 1


def test_an_environment_build_jail_says_when_the_sandbox_cannot_run(tmp_path):
    bwrap, gate, calls = tmp_path / "bwrap", tmp_path / "gate", tmp_path / "calls"
    gated_bwrap(bwrap, gate, calls)  # no gate: it fails
    builder = BuildSandbox.for_policy(SandboxPolicy(bwrap=bwrap), environ={})
    build = tmp_path / "build"
    build.mkdir()
    with (
        pytest.raises(SandboxUnavailable, match="No permissions"),
        builder.jail(
            workspace=tmp_path,
            build=build,
            uv_cache=tmp_path / "uv-cache",
            uv=["uv"],
            interpreter=Path("/usr/bin/python3"),
        ),
    ):
        pass
