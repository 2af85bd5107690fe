"""POST /rollout: 202 with a polling lease, 409, 422 and 429 (protocol 0.4, §3.10)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from .harness import OSMOSIS_AI, RolloutServer, meta, new_id, pending, rollout_body
from .settings import MAIN


def test_admission_returns_202_with_lease_and_polling_parameters(main: RolloutServer) -> None:
    rollout_id = new_id()
    response = main.post_rollout(rollout_body(rollout_id, meta()))

    assert response.status_code == 202
    body = response.json()
    assert set(body) == {
        "rollout_id",
        "status",
        "polling_lease_token",
        "result_wait_timeout_sec",
        "polling_lease_timeout_sec",
    }
    assert body["rollout_id"] == rollout_id
    assert body["status"] == "queued"
    assert isinstance(body["polling_lease_token"], str)
    assert body["polling_lease_token"]
    assert body["result_wait_timeout_sec"] == MAIN.result_wait_timeout_sec
    assert body["polling_lease_timeout_sec"] == MAIN.polling_lease_timeout_sec


def test_each_rollout_gets_its_own_lease(main: RolloutServer) -> None:
    first = main.submit(meta())
    second = main.submit(meta())

    assert first.lease != second.lease
    assert [r["status"] for r in main.wait_terminal_all([first, second])] == ["success"] * 2


def test_duplicate_rollout_id_is_409_in_flight_and_after_completion(main: RolloutServer) -> None:
    handle = main.submit(meta(behaviour="sleep:0.3"))

    assert main.post_rollout(rollout_body(handle.rollout_id, meta())).status_code == 409
    assert main.wait_terminal(handle)["status"] == "success"
    # The finished result is retained, and so is its id.
    assert main.post_rollout(rollout_body(handle.rollout_id, meta())).status_code == 409
    # The refused duplicates did not disturb the original rollout or its lease.
    assert main.wait_terminal(handle)["sample"]["reward"] == 1.0


def _with(**fields: Any) -> Callable[[str], dict[str, Any]]:
    def build(rollout_id: str) -> dict[str, Any]:
        return {**rollout_body(rollout_id, meta()), **fields}

    return build


def _without(key: str) -> Callable[[str], dict[str, Any]]:
    def build(rollout_id: str) -> dict[str, Any]:
        body = rollout_body(rollout_id, meta())
        del body[key]
        return body

    return build


def _raw(key: str, literal: str) -> Callable[[str], bytes]:
    """A body whose `key` holds a JSON literal no encoder would write (1e999, NaN)."""

    def build(rollout_id: str) -> bytes:
        body = json.dumps(rollout_body(rollout_id, meta()))
        return f'{body[:-1]}, "{key}": {literal}}}'.encode()

    return build


INVALID_BODIES: dict[str, Callable[[str], dict[str, Any] | bytes]] = {
    "rollout_id with /": lambda rid: rollout_body(f"{rid}/x", meta()),
    "rollout_id with backslash": lambda rid: rollout_body(f"{rid}\\x", meta()),
    "rollout_id with NUL": lambda rid: rollout_body(f"{rid}\x00", meta()),
    "rollout_id ..": lambda rid: rollout_body("..", meta()),
    "rollout_id .": lambda rid: rollout_body(".", meta()),
    "rollout_id empty": lambda rid: rollout_body("", meta()),
    "llm_api_key empty": _with(llm_api_key=""),
    "chat_completions_url missing": _without("chat_completions_url"),
    "initial_messages missing": _without("initial_messages"),
    "rollout_id missing": _without("rollout_id"),
    "initial_messages not a list": _with(initial_messages="What is 2 + 2?"),
    "metadata not an object": _with(metadata=["behaviour", "echo"]),
    "label not a string": _with(label=4),
    "grade not a bool": _with(grade="maybe"),
    "body not JSON": lambda rid: b"{not json",
    "body a JSON array": lambda rid: b"[]",
}


@pytest.mark.parametrize("build", INVALID_BODIES.values(), ids=list(INVALID_BODIES))
def test_invalid_body_is_422_and_stores_nothing(
    main: RolloutServer, build: Callable[[str], dict[str, Any] | bytes]
) -> None:
    rollout_id = new_id()

    response = main.post_rollout(build(rollout_id))

    assert response.status_code == 422, response.text
    # Nothing was registered: the same id is still free for a valid request.
    handle = main.submit(meta(), rollout_id=rollout_id)
    assert main.wait_terminal(handle)["status"] == "success"


NON_FINITE_TIMEOUTS: dict[str, Callable[[str], bytes]] = {
    "agent_timeout_sec 1e999": _raw("agent_timeout_sec", "1e999"),
    "grader_timeout_sec 1e999": _raw("grader_timeout_sec", "1e999"),
    "agent_timeout_sec -1e999": _raw("agent_timeout_sec", "-1e999"),
    "agent_timeout_sec NaN": _raw("agent_timeout_sec", "NaN"),
}


@pytest.mark.parametrize("build", NON_FINITE_TIMEOUTS.values(), ids=list(NON_FINITE_TIMEOUTS))
def test_non_finite_timeout_is_rejected_and_stores_nothing(
    main: RolloutServer, build: Callable[[str], bytes]
) -> None:
    rollout_id = new_id()

    # Its own connection: osmosis-ai closes the connection after the 500 described below.
    with main.fresh_client() as client:
        response = main.post_rollout(build(rollout_id), client=client)

    handle = main.submit(meta(), rollout_id=rollout_id)
    assert main.wait_terminal(handle)["status"] == "success"
    # The reference (§3.10) says 422. osmosis-ai 0.3.8 does reject the value, but FastAPI's
    # default 422 handler then fails to encode the offending inf/nan input as JSON, so the
    # client sees a 500 (and the connection is dropped). Ours must answer the 422 it means.
    expected = 500 if main.flavour is OSMOSIS_AI else 422
    assert response.status_code == expected, response.text


def test_unknown_request_fields_are_ignored(main: RolloutServer) -> None:
    # Callback-protocol fields from older SDKs are dropped silently (§14).
    handle = main.submit(
        meta(),
        completion_callback_url="http://127.0.0.1:9/done",
        controller_api_key="legacy",
    )

    assert main.wait_terminal(handle)["status"] == "success"


def test_llm_api_key_may_be_omitted(main: RolloutServer) -> None:
    body = rollout_body(new_id(), meta())
    del body["llm_api_key"]

    response = main.post_rollout(body)

    assert response.status_code == 202, response.text


def test_full_backend_is_429_with_retry_after_and_registers_nothing(tight: RolloutServer) -> None:
    # TIGHT admits two pending rollouts (one running, one waiting for the single slot).
    running = tight.submit(meta(behaviour="sleep:30"))
    waiting = tight.submit(meta(behaviour="sleep:30"))
    tight.wait_health(lambda h: pending(h) == 2)
    refused_id = new_id()

    response = tight.post_rollout(rollout_body(refused_id, meta()))

    assert response.status_code == 429, response.text
    assert response.headers["Retry-After"] == "5"
    assert pending(tight.health()) == 2
    # Once capacity frees up, the refused id is admitted: the 429 stored nothing.
    tight.cancel_ok({"ids": [running.rollout_id, waiting.rollout_id]})
    tight.wait_idle()
    handle = tight.submit(meta(), rollout_id=refused_id)
    assert tight.wait_terminal(handle)["status"] == "success"
