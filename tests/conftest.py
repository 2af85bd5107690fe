"""Suite-wide hooks.

`.ci/run` sets `OSMOSIS_NO_SKIPS=1`: there a skipped test fails, with its reason, because CI
installs everything the suite needs, and a test that silently stops running (the osmosis-ai
venv failed to build, the index was unreachable) must not leave CI green.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Generator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if (
        report.skipped
        and not hasattr(report, "wasxfail")
        and os.environ.get("OSMOSIS_NO_SKIPS") == "1"
    ):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped, and OSMOSIS_NO_SKIPS=1 forbids skips: {reason}"
