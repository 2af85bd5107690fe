"""The server configurations the conformance suite starts, one process per flavour each."""

from __future__ import annotations

from .apps.behaviours import ServerSettings

# Most tests: room to run many rollouts at once, a long-poll long enough to tell an early
# return from a timeout, results retained for the whole session, and a bearer key on every
# route (the harness sends it; test_auth.py checks what happens without it).
MAIN = ServerSettings(
    result_wait_timeout_sec=5.0,
    polling_lease_timeout_sec=15.0,
    result_retention_sec=600.0,
    max_concurrent=8,
    api_key="conformance-server-key",
)
MAIN_INSTANCE_ID = "conformance-main-instance"
# Queueing, capacity, lease expiry and retention: one slot, at most two pending rollouts, and
# timers short enough to watch expire; polling clients renew the lease every ~0.3 s, far
# inside its 1.5 s. No api_key and no instance id.
TIGHT = ServerSettings(
    result_wait_timeout_sec=0.3,
    polling_lease_timeout_sec=1.5,
    result_retention_sec=1.5,
    max_concurrent=1,
    max_pending=2,
)
# Shut down by test_shutdown.py.
DOOMED = ServerSettings(
    result_wait_timeout_sec=1.0,
    polling_lease_timeout_sec=10.0,
    result_retention_sec=60.0,
    max_concurrent=2,
)
