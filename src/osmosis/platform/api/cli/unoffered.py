"""What the official CLI may ask for and this server does not offer: training, models,
benchmarks, rollouts and the hosted quickstart. Each answers 501
`NOT_OFFERED` saying so, in the official error shape, rather than a bare 404.
"""

from __future__ import annotations

from fastapi import APIRouter

from osmosis.platform.core.errors import NotFound, PlatformError

from .errors import OfficialRoute

router = APIRouter(route_class=OfficialRoute)

# Path prefix under /api/cli -> what to say instead.
UNOFFERED = {
    "training-runs": "training runs are not offered by this server (it evaluates; "
    "`osmosis eval` works)",
    "models": "model hosting (base and LoRA models, deploy/undeploy) is not offered by this server",
    "benchmarks": "benchmarks are not offered by this server",
    "benchmark-runs": "benchmark runs are not offered by this server",
    "rollouts": "the rollout catalogue is not offered by this server",
    "quickstart": "the hosted quickstart is not offered by this server; see `osmosis init`",
}
_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


class NotOffered(PlatformError):
    code = "NOT_OFFERED"
    status_code = 501


def _refuse(message: str) -> NotOffered:
    return NotOffered(message, details={"offered": ["auth", "dataset", "secret", "eval"]})


def _add(prefix: str, message: str) -> None:
    def not_offered(rest: str = "") -> None:
        raise _refuse(message)

    not_offered.__name__ = f"not_offered_{prefix.replace('-', '_')}"
    router.add_api_route(f"/{prefix}", not_offered, methods=_METHODS, include_in_schema=False)
    router.add_api_route(
        f"/{prefix}/{{rest:path}}", not_offered, methods=_METHODS, include_in_schema=False
    )


for _prefix, _message in UNOFFERED.items():
    _add(_prefix, _message)


def unknown_route(rest: str) -> None:
    """Any other `/api/cli` path: a 404 in the official shape (mounted last)."""
    raise NotFound(
        f"this server has no route /api/cli/{rest}", details={"path": f"/api/cli/{rest}"}
    )
