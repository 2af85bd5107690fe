"""Bearer auth: with an api_key (MAIN has one) every route answers 401 unless the request
carries `Authorization: Bearer <key>`. Every other MAIN test shows the right key works."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from .harness import LEASE_HEADER, RolloutServer, meta, new_id, rollout_body
from .settings import MAIN

assert MAIN.api_key is not None
BAD_AUTHORIZATION: dict[str, dict[str, str]] = {
    "missing": {},
    "wrong key": {"Authorization": "Bearer not-the-key"},
    "no scheme": {"Authorization": MAIN.api_key},
    "basic scheme": {"Authorization": f"Basic {MAIN.api_key}"},
    "bearer without key": {"Authorization": "Bearer"},
    "key prefix": {"Authorization": f"Bearer {MAIN.api_key[:-1]}"},
}

# Each route, called with the given headers; the id and lease belong to a real rollout.
Call = Callable[[httpx.Client, str, str, dict[str, str]], httpx.Response]
ROUTES: dict[str, Call] = {
    "GET /health": lambda c, rid, lease, h: c.get("/health", headers=h),
    "POST /rollout": lambda c, rid, lease, h: c.post(
        "/rollout", json=rollout_body(new_id(), meta()), headers=h
    ),
    "GET /rollout/{id}/result": lambda c, rid, lease, h: c.get(
        f"/rollout/{rid}/result", headers={**h, LEASE_HEADER: lease}
    ),
    "POST /rollout/cancel": lambda c, rid, lease, h: c.post(
        "/rollout/cancel", json={"all": True}, headers=h
    ),
}


@pytest.mark.parametrize("route", ROUTES.values(), ids=list(ROUTES))
@pytest.mark.parametrize("headers", BAD_AUTHORIZATION.values(), ids=list(BAD_AUTHORIZATION))
def test_every_route_refuses_a_bad_or_missing_bearer_token(
    main: RolloutServer, route: Call, headers: dict[str, str]
) -> None:
    handle = main.submit(meta(behaviour="sleep:30"))
    main.wait_health(lambda h: h["concurrency"]["running"] == 1)

    response = route(main.http, handle.rollout_id, handle.lease, headers)

    assert response.status_code == 401, response.text
    # Nothing happened behind the refusal: the rollout still runs, nothing else was admitted.
    health = main.health()
    assert health["concurrency"]["running"] == 1
    assert health["lifecycle"]["active_rollouts"] == 1


def test_the_right_bearer_token_opens_every_route(main: RolloutServer) -> None:
    good = main.auth()
    rollout_id = new_id()

    assert main.http.get("/health", headers=good).status_code == 200
    body = rollout_body(rollout_id, meta(behaviour="sleep:30"))
    admitted = main.http.post("/rollout", json=body, headers=good)
    assert admitted.status_code == 202
    main.wait_health(lambda h: h["concurrency"]["running"] == 1)
    cancelled = main.http.post("/rollout/cancel", json={"ids": [rollout_id]}, headers=good)
    assert cancelled.status_code == 200
    assert cancelled.json()["dispositions"] == {rollout_id: "cancelled_running"}
    lease = admitted.json()["polling_lease_token"]
    polled = main.http.get(f"/rollout/{rollout_id}/result", headers={**good, LEASE_HEADER: lease})
    assert polled.status_code == 200
    assert polled.json()["status"] == "cancelled"


def test_auth_is_checked_before_validation_and_lookup(main: RolloutServer) -> None:
    # No probing without the key: invalid bodies and unknown ids are 401 too, not 422/404.
    assert main.http.post("/rollout", json={"rollout_id": "a/b"}).status_code == 401
    assert main.http.get(f"/rollout/{new_id()}/result").status_code == 401
    assert main.http.post("/rollout/cancel", json={}).status_code == 401


def test_a_server_without_api_key_needs_no_authorization(tight: RolloutServer) -> None:
    assert tight.settings.api_key is None
    assert tight.http.get("/health").status_code == 200
