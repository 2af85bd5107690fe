"""GET /health: the backend's health plus the server's identity and lifecycle."""

from __future__ import annotations

from .harness import RolloutServer, meta
from .settings import MAIN, MAIN_INSTANCE_ID, TIGHT


def test_health_reports_status_concurrency_identity_and_lifecycle(main: RolloutServer) -> None:
    health = main.health()

    assert health["status"] == "ok"
    assert health["concurrency"] == {
        "max_concurrent": MAIN.max_concurrent,
        "queued": 0,
        "running": 0,
    }
    assert health["instance_id"] == MAIN_INSTANCE_ID  # from _OSMOSIS_ROLLOUT_INSTANCE_ID
    assert isinstance(health["process_id"], str)
    assert health["process_id"] not in ("", MAIN_INSTANCE_ID)
    assert health["lifecycle"] == {"accepting_rollouts": True, "active_rollouts": 0}


def test_process_id_is_stable_for_the_life_of_the_process(main: RolloutServer) -> None:
    assert main.health()["process_id"] == main.health()["process_id"]


def test_instance_id_defaults_to_the_process_id(tight: RolloutServer) -> None:
    health = tight.health()  # TIGHT runs without _OSMOSIS_ROLLOUT_INSTANCE_ID

    assert health["instance_id"] == health["process_id"]


def test_health_counts_running_and_queued_rollouts(tight: RolloutServer) -> None:
    tight.submit(meta(behaviour="sleep:30"))
    tight.submit(meta(behaviour="sleep:30"))

    health = tight.wait_health(
        lambda h: h["concurrency"]["running"] == 1 and h["concurrency"]["queued"] == 1
    )

    assert health["concurrency"]["max_concurrent"] == TIGHT.max_concurrent
    assert health["lifecycle"] == {"accepting_rollouts": True, "active_rollouts": 2}
