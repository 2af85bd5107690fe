"""The typed seam: the site a host asks for, and a resource limit crossing it as a value."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from osmosis.eval.results.classify import classify
from osmosis.eval.results.records import WorkItem
from osmosis.eval.results.redact import Redactor
from osmosis.eval.results.trial_outputs import DEFAULT_ARTIFACT_LIMITS
from osmosis.eval.sites.api import ResourceLimitBreach, ResultWithBreach
from osmosis.eval.sites.environment import RolloutEnvironment
from osmosis.eval.sites.local import LocalProcessSite
from osmosis.eval.sites.sandbox.site import SandboxSite
from osmosis.eval.sites.spec import LocalSiteSpec, SandboxSiteSpec, SiteContext, build_site
from osmosis.rollout.protocol import RolloutResultResponse
from osmosis.rollout.types import ErrorCategory, RolloutStatus

RID = "0" * 32
ITEM = WorkItem(
    row_index=0, run_index=0, source_row_index=0, messages=[], label=None, metadata=None
)


def context(tmp_path: Path, *, bound: str = "http://0.0.0.0:8123") -> SiteContext:
    return SiteContext(
        workspace=tmp_path,
        rollout_dir=tmp_path / "rollouts" / "echo",
        entrypoint="main.py",
        env={},
        trials_root=tmp_path / "trials",
        log=lambda line: None,
        redactor=Redactor([]),
        artifact_limits=DEFAULT_ARTIFACT_LIMITS,
        bridge_url="http://127.0.0.1:8123",
        bridge_bound_url=bound,
        environment=RolloutEnvironment(
            python=Path(sys.executable), kind="current", cache_key=None, sdk="osmosis"
        ),
    )


def test_a_breach_says_what_the_sandbox_always_said():
    breach = ResourceLimitBreach("rollout server 'echo'", "memory limit (512 MiB)")
    said = "resource_limit: rollout server 'echo' exceeded its memory limit (512 MiB)"
    assert str(breach) == said


def test_only_a_sites_breach_fails_an_attempt_resource_limit():
    breach = ResourceLimitBreach("the attempt", "output limit (2048 bytes per attempt)")
    charged = ResultWithBreach(
        rollout_id=RID, status=RolloutStatus.FAILURE, err_message=str(breach), breach=breach
    )
    record = classify(ITEM, charged, [], rollout_id=RID, duration_ms=1.0)
    assert (record.error_type, record.error_message) == ("resource_limit", str(breach))
    # A rollout's own message with the same words is its failure, not a limit of ours.
    claimed = RolloutResultResponse(
        rollout_id=RID,
        status=RolloutStatus.FAILURE,
        err_message=str(breach),
        err_category=ErrorCategory.AGENT_ERROR,
    )
    assert classify(ITEM, claimed, [], rollout_id=RID, duration_ms=1.0).error_type == "agent_error"


def test_each_spec_builds_its_site(tmp_path):
    assert type(build_site(LocalSiteSpec(), context(tmp_path))) is LocalProcessSite
    hidden = tmp_path / "platform-home"
    site = build_site(SandboxSiteSpec(hidden=(hidden,)), context(tmp_path))
    assert isinstance(site, SandboxSite)
    assert site.bridge_address == ("127.0.0.1", 8123)  # the wildcard it binds, reached locally
    assert site.hidden == (tmp_path / ".osmosis", hidden)


def test_a_site_on_this_machine_needs_the_prepared_environment(tmp_path):
    without = replace(context(tmp_path), environment=None)
    with pytest.raises(ValueError, match="prepared environment"):
        build_site(LocalSiteSpec(), without)


def test_only_a_ray_spec_imports_the_ray_site():
    code = (
        "import sys; from osmosis.eval.sites import spec; import osmosis.eval.host.run; "
        "print('osmosis.eval.sites.ray.site' in sys.modules, 'ray' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
