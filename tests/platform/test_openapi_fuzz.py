"""Property-based requests from the served OpenAPI document (schemathesis): never a 5xx.

Every operation the server documents gets generated requests, valid and invalid, with the
admin token; whatever they contain, the answer is a response in our envelope, not a crash.
(The strategies are driven with hypothesis directly: schemathesis' lazy pytest fixture does
not support pytest 9.)
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.platform.conftest import RunningPlatform

FUZZ = settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@pytest.mark.slow  # ~60 s per database
def test_no_generated_request_gets_a_server_error(running_platform: RunningPlatform):
    schema = schemathesis.openapi.from_url(f"{running_platform.url}/openapi.json")
    headers = {"Authorization": f"Bearer {running_platform.admin_token}"}
    tried = []
    for result in schema.get_all_operations():
        operation = result.ok()
        tried.append(operation.label)

        @FUZZ
        @given(case=operation.as_strategy())
        def never_a_server_error(case: schemathesis.Case) -> None:
            response = case.call(base_url=running_platform.url, headers=headers, timeout=30)
            where = f"{case.method} {case.formatted_path}"
            assert response.status_code < 500, f"{where} -> {response.status_code}: {response.text}"
            if response.status_code >= 400:
                assert set(response.json()) == {"error"}, f"{where}: {response.text[:300]}"

        never_a_server_error()
    assert len(tried) >= 10, tried  # the document really lists the API
