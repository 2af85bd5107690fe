"""Store functions for workspaces and their members. Keyword arguments, no HTTP in sight.

    rules = rules_for(settings)                          # who creates, what may be cloned
    ws = open_workspace(db, identity="Acme/Evals.git", user=ada, rules=rules)  # 'acme/evals'
    add_member(db, workspace=ws, email="bob@example.com", role=MEMBER)

A workspace is named by the canonical identity of its git origin
(`osmosis.workspace.canonical_identity`): every spelling a client sends meets the same row.
Workspaces are not first-come claims:

- **Creation** follows `OSMOSIS_WORKSPACE_CREATION`: `admin` (default) lets only admins create
  one (explicitly, or on an admin's first use, which is how the embedded single-user setup
  works with no step); `open` lets any user create one for an origin the server may clone.
- **Origins** must pass `OSMOSIS_CLONE_ALLOW` (`osmosis.platform.services.origins`) at creation, and
  again before each clone.
- **Roles**: an owner adds, removes and re-roles members; a member uses the workspace and may
  leave it. Admins may act as owners of any workspace. The last active owner stays.

Nothing tells a non-member whether a workspace exists: every refusal that a non-member can
get is decided before the row is looked at, or is the one `not_found` answer.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from osmosis.platform.core.db.dialect import lock_rows
from osmosis.platform.core.db.models import User, Workspace, WorkspaceMember, utcnow
from osmosis.platform.core.errors import (
    Conflict,
    Forbidden,
    NotFound,
    PlatformError,
    ValidationFailed,
)
from osmosis.platform.core.settings import Settings
from osmosis.platform.services.origins import (
    CLONE_ALLOW_ENV,
    CloneAllow,
    origin_problem,
    parse_clone_allow,
)
from osmosis.workspace import canonical_identity

logger = logging.getLogger("osmosis.platform")

OWNER = "owner"
MEMBER = "member"
ADMIN_ONLY = "admin"
OPEN = "open"
MAX_IDENTITY = 1024
CREATION_ENV = "OSMOSIS_WORKSPACE_CREATION"

GIT_HEADER = "X-Osmosis-Git"


class GitScopeHeaderRequired(PlatformError):
    code = "GIT_SCOPE_HEADER_REQUIRED"
    status_code = 400


class WorkspaceNotFound(NotFound):
    """Raised alike for a workspace that does not exist and one the caller is not in."""


class NotOwner(Forbidden):
    """A member asked for what only an owner (or an admin) may do."""

    code = "NOT_OWNER"


class OriginNotAllowed(Forbidden):
    """The server may not clone this origin (`OSMOSIS_CLONE_ALLOW`)."""

    code = "ORIGIN_NOT_ALLOWED"


@dataclass(frozen=True)
class WorkspaceRules:
    """Who may create workspaces (`creation`: "admin" or "open") and what may be cloned."""

    creation: str
    allow: CloneAllow


def rules_for(settings: Settings) -> WorkspaceRules:
    """The rules of `settings` (parsed once per distinct value)."""
    return _rules(settings.workspace_creation, settings.clone_allow)


@lru_cache(maxsize=8)
def _rules(creation: str, clone_allow: str | None) -> WorkspaceRules:
    rules = WorkspaceRules(creation=creation, allow=parse_clone_allow(clone_allow))
    if creation == OPEN and not rules.allow.configured:
        logger.warning(
            "%s=open with %s unset: any user may create a workspace for any remote "
            "repository the server's git can read; list the allowed origins in %s",
            CREATION_ENV,
            CLONE_ALLOW_ENV,
            CLONE_ALLOW_ENV,
        )
    return rules


def not_found(identity: str, *, rules: WorkspaceRules | None = None) -> WorkspaceNotFound:
    # One message whether it exists or not; the hint depends only on the server's policy.
    hint = "ask an owner of the workspace to add you (osmosis workspace member add EMAIL)"
    if rules is not None and rules.creation == ADMIN_ONLY:
        hint += (
            "; if it is new, an admin creates it (osmosis workspace create ORIGIN --owner EMAIL)"
        )
    return WorkspaceNotFound(
        "workspace not found among your workspaces", details={"git": identity, "hint": hint}
    )


def check_identity(identity: str) -> str:
    """`identity` in its canonical form, or `ValidationFailed` saying what a valid one is."""
    if len(identity) > MAX_IDENTITY:
        raise ValidationFailed(
            f"{GIT_HEADER} must be a workspace identity of at most {MAX_IDENTITY} characters"
        )
    try:
        return canonical_identity(identity)
    except ValueError as error:
        raise ValidationFailed(
            f"{GIT_HEADER} must name a repository (owner/repo, host/path or file:///path): {error}",
            details={"header": GIT_HEADER},
        ) from None


def membership(db: Session, *, workspace_id: str, user_id: str) -> WorkspaceMember | None:
    return db.get(WorkspaceMember, (workspace_id, user_id))


def _by_identity(db: Session, identity: str) -> Workspace | None:
    return db.scalar(select(Workspace).where(Workspace.identity == identity))


def find_for_member(db: Session, *, identity: str, user: User) -> Workspace:
    """The workspace `identity` if `user` belongs to it, else `WorkspaceNotFound`."""
    identity = check_identity(identity)
    workspace = _by_identity(db, identity)
    if workspace is None or membership(db, workspace_id=workspace.id, user_id=user.id) is None:
        raise not_found(identity)
    return workspace


def find_for_owner(db: Session, *, identity: str, user: User) -> Workspace:
    """The workspace `identity` if `user` may change its members: an owner, or an admin.
    A plain member gets `NotOwner` (403); anyone else the usual `WorkspaceNotFound`."""
    identity = check_identity(identity)
    workspace = _by_identity(db, identity)
    member = membership(db, workspace_id=workspace.id, user_id=user.id) if workspace else None
    if workspace is None or (member is None and not user.is_admin):
        raise not_found(identity)
    if member is not None and member.role != OWNER and not user.is_admin:
        raise NotOwner(
            "only an owner of this workspace adds, removes or changes members; "
            f"its owners: {', '.join(_owner_names(db, workspace)) or 'none'}",
            details={"git": identity, "role": member.role},
        )
    return workspace


def open_workspace(db: Session, *, identity: str, user: User, rules: WorkspaceRules) -> Workspace:
    """The workspace `identity` for `user`: theirs if they are a member, else created for
    them with `user` as owner when the rules allow it, else `WorkspaceNotFound` (whether
    it exists or not) or `OriginNotAllowed` (decided from the identity alone)."""
    identity = check_identity(identity)
    workspace = _by_identity(db, identity)
    if workspace is not None and membership(db, workspace_id=workspace.id, user_id=user.id):
        return workspace
    if rules.creation == ADMIN_ONLY and not user.is_admin:
        raise not_found(identity, rules=rules)
    _check_origin(rules, identity, by_admin=user.is_admin)
    if workspace is not None:
        raise not_found(identity, rules=rules)
    try:
        return _create(db, identity=identity, owner=user, creator=user)
    except Conflict:
        # A concurrent first request of the same user created it: that one is the answer.
        workspace = _by_identity(db, identity)
        if workspace is not None and membership(db, workspace_id=workspace.id, user_id=user.id):
            return workspace
        raise not_found(identity, rules=rules) from None


def create_workspace(
    db: Session, *, identity: str, user: User, rules: WorkspaceRules, owner: User | None = None
) -> Workspace:
    """Create the workspace `identity` with `owner` (default `user`) as its owner.

    Refused (403) when the policy does not let `user` create one, when a non-admin names
    another owner, or when the origin may not be cloned; an existing one is a Conflict.
    """
    identity = check_identity(identity)
    if rules.creation == ADMIN_ONLY and not user.is_admin:
        raise Forbidden(
            f"only an admin creates workspaces on this server ({CREATION_ENV}=admin); ask "
            "one to run `osmosis workspace create ORIGIN --owner YOUR_EMAIL`",
            details={"setting": CREATION_ENV},
        )
    if owner is not None and owner.id != user.id and not user.is_admin:
        raise Forbidden("only an admin creates a workspace for another user")
    owner = owner or user
    if not owner.is_active:
        raise Conflict(f"user {owner.name!r} is deactivated", details={"user_id": owner.id})
    _check_origin(rules, identity, by_admin=user.is_admin)
    existing = _by_identity(db, identity)
    if existing is not None:
        mine = membership(db, workspace_id=existing.id, user_id=user.id)
        raise Conflict(
            f"you are already {'an owner' if mine.role == OWNER else 'a member'} of {identity}"
            if mine is not None
            else f"a workspace for {identity} exists already; ask an owner to add you",
            details={"git": identity},
        )
    return _create(db, identity=identity, owner=owner, creator=user)


def _check_origin(rules: WorkspaceRules, identity: str, *, by_admin: bool) -> None:
    problem = origin_problem(rules.allow, identity, by_admin=by_admin)
    if problem is not None:
        raise OriginNotAllowed(problem, details={"git": identity, "setting": CLONE_ALLOW_ENV})


def _create(db: Session, *, identity: str, owner: User, creator: User) -> Workspace:
    workspace = Workspace(identity=identity, created_by=creator.id, created_at=utcnow())
    db.add(workspace)
    db.add(WorkspaceMember(workspace=workspace, user_id=owner.id, role=OWNER, created_at=utcnow()))
    try:
        db.commit()
    except IntegrityError:  # another request created it first; it is theirs, not ours
        db.rollback()
        raise Conflict(f"a workspace for {identity} was created meanwhile") from None
    logger.info("workspace %s created for %r, owner %s", workspace.id, identity, owner.name)
    return workspace


def get_or_create(db: Session, *, identity: str, user: User) -> Workspace:
    """The workspace `identity`, created with `user` as its owner if it does not exist.

    A store-level helper (seeding, tests) that applies no policy: requests go through
    `open_workspace`. An existing workspace the user is not a member of is a
    `WorkspaceNotFound`.
    """
    identity = check_identity(identity)
    if _by_identity(db, identity) is None:
        try:
            return _create(db, identity=identity, owner=user, creator=user)
        except Conflict:
            pass
    return find_for_member(db, identity=identity, user=user)


def for_user(db: Session, *, user: User) -> list[tuple[Workspace, str, int]]:
    """`user`'s workspaces by identity, each with their role and its member count."""
    counts = (
        select(WorkspaceMember.workspace_id, func.count().label("members"))
        .group_by(WorkspaceMember.workspace_id)
        .subquery()
    )
    query = (
        select(Workspace, WorkspaceMember.role, counts.c.members)
        .join(WorkspaceMember, WorkspaceMember.workspace_id == Workspace.id)
        .join(counts, counts.c.workspace_id == Workspace.id)
        .where(WorkspaceMember.user_id == user.id)
        .order_by(Workspace.identity)
    )
    return [(ws, role, int(n)) for ws, role, n in db.execute(query).all()]


# -- members --------------------------------------------------------------------------------
def members(db: Session, *, workspace: Workspace) -> list[WorkspaceMember]:
    query = (
        select(WorkspaceMember)
        .where(WorkspaceMember.workspace_id == workspace.id)
        .order_by(WorkspaceMember.created_at, WorkspaceMember.user_id)
    )
    return list(db.scalars(query))


def _owner_names(db: Session, workspace: Workspace) -> list[str]:
    return [m.user.name for m in members(db, workspace=workspace) if m.role == OWNER]


def find_member(db: Session, *, workspace: Workspace, ref: str) -> WorkspaceMember:
    """The member named by user id, name or email. Only members are searched, so the answer
    for a registered outsider and for an unknown address is the same `NotFound`."""
    query = (
        select(WorkspaceMember)
        .join(User, User.id == WorkspaceMember.user_id)
        .where(
            WorkspaceMember.workspace_id == workspace.id,
            or_(User.id == ref, User.name == ref, User.email == ref),
        )
    )
    member = db.scalar(query.limit(1))
    if member is None:
        raise NotFound(f"{ref!r} is not a member of this workspace", details={"member": ref})
    return member


def add_member(
    db: Session,
    *,
    workspace: Workspace,
    user_id: str | None = None,
    email: str | None = None,
    role: str = MEMBER,
) -> WorkspaceMember:
    """Add an existing user, named by id or email; unknown users are `NotFound`.

    The caller has checked that the requester is an owner (`find_for_owner`): only owners
    learn whether an address belongs to a registered user.
    """
    if (user_id is None) == (email is None):
        raise ValidationFailed("name the user by exactly one of user_id or email")
    if role not in (OWNER, MEMBER):
        raise ValidationFailed(f"role must be {OWNER} or {MEMBER}", details={"field": "role"})
    if user_id is not None:
        user = db.get(User, user_id)
    else:
        user = db.scalar(select(User).where(User.email == email))
    if user is None:
        named = f"with email {email}" if email is not None else f"with id {user_id!r}"
        raise NotFound(
            f"no user {named}; an admin creates users (osmosis admin user create)",
            details={"user_id": user_id, "email": email},
        )
    if not user.is_active:
        raise Conflict(f"user {user.name!r} is deactivated", details={"user_id": user.id})
    if membership(db, workspace_id=workspace.id, user_id=user.id) is not None:
        raise Conflict(
            f"user {user.name!r} is already a member of this workspace",
            details={"user_id": user.id},
        )
    member = WorkspaceMember(
        workspace_id=workspace.id, user_id=user.id, role=role, created_at=utcnow()
    )
    db.add(member)
    try:
        db.flush()
    except IntegrityError:  # added concurrently by another owner
        db.rollback()
        raise Conflict("the user is already a member of this workspace") from None
    return member


def remove_member(db: Session, *, workspace: Workspace, member: WorkspaceMember) -> None:
    """Remove `member`; the last active owner stays (Conflict)."""
    _keep_an_owner(db, workspace=workspace, member=member, what="remove")
    db.delete(member)
    db.flush()


def set_role(
    db: Session, *, workspace: Workspace, member: WorkspaceMember, role: str
) -> WorkspaceMember:
    """Make `member` an owner or a member; the last active owner stays an owner."""
    if role not in (OWNER, MEMBER):
        raise ValidationFailed(f"role must be {OWNER} or {MEMBER}", details={"field": "role"})
    if role == MEMBER:
        _keep_an_owner(db, workspace=workspace, member=member, what="demote")
    member.role = role
    db.flush()
    return member


def _keep_an_owner(
    db: Session, *, workspace: Workspace, member: WorkspaceMember, what: str
) -> None:
    if member.role != OWNER:
        return
    # Two owners demoting each other at once would each count the other and leave none.
    lock_rows(db, Workspace, Workspace.id == workspace.id)
    others = db.scalar(
        select(func.count())
        .select_from(WorkspaceMember)
        .join(User, User.id == WorkspaceMember.user_id)
        .where(
            WorkspaceMember.workspace_id == workspace.id,
            WorkspaceMember.role == OWNER,
            WorkspaceMember.user_id != member.user_id,
            User.deactivated_at.is_(None),
        )
    )
    if not others:
        raise Conflict(
            f"cannot {what} {member.user.name!r}: they are the last active owner of this "
            "workspace; make another member an owner first "
            "(osmosis workspace member set-role USER owner)",
            details={"user_id": member.user_id},
        )


SANDBOX_NETWORKS = ("bridge", "full")


def set_sandbox_network(db: Session, *, workspace: Workspace, network: str | None) -> Workspace:
    """Let this workspace's sandboxed rollouts reach `bridge` only or the `full` internet;
    None: the platform's `OSMOSIS_SANDBOX_NETWORK`. Who may (an admin) is the caller's check.

    set_sandbox_network(db, workspace=ws, network="full")  # its agents' tools browse the web
    """
    if network is not None and network not in SANDBOX_NETWORKS:
        raise ValidationFailed(
            f"sandbox_network must be one of {', '.join(SANDBOX_NETWORKS)} or unset, got "
            f"{network!r}",
            details={"field": "sandbox_network"},
        )
    workspace.sandbox_network = network
    db.flush()
    return workspace


def sandbox_network(workspace: Workspace | None, settings: Settings) -> str:
    """The network a run of `workspace` gets: its own setting, else the platform's."""
    own = workspace.sandbox_network if workspace is not None else None
    return own or settings.sandbox_network


BUDGET_LIMITS = ("max_tokens_total", "max_cost_usd", "max_model_calls")
"""A run's budget limits (`[evaluation]`), each of which a workspace may default and cap."""

_BUDGET_COLUMNS = {
    "max_tokens_total": "tokens_total",
    "max_cost_usd": "cost_usd",
    "max_model_calls": "model_calls",
}
_BUDGET_MAX = {"max_tokens_total": 10**15, "max_cost_usd": 10.0**9, "max_model_calls": 10**15}
"""Far beyond any real run; keeps a typo (or a fuzzer) inside the columns' range."""
PLATFORM_CEILING_ENVS = {key: f"OSMOSIS_BUDGET_MAX_{key[4:].upper()}" for key in BUDGET_LIMITS}


class InvalidBudget(PlatformError):
    code = "INVALID_BUDGET"
    status_code = 400


def budget_limits(workspace: Workspace, kind: str) -> dict[str, int | float | None]:
    """The workspace's `default` or `ceiling` of each limit (None: none)."""
    return {
        key: getattr(workspace, f"budget_{kind}_{column}")
        for key, column in _BUDGET_COLUMNS.items()
    }


def find_for_budget(db: Session, *, identity: str, user: User) -> Workspace:
    """The workspace `identity` for a budget change: a member's (the change itself says who
    may), or any for an admin; anyone else the usual `WorkspaceNotFound`."""
    identity = check_identity(identity)
    workspace = _by_identity(db, identity)
    if workspace is None or not (
        user.is_admin or membership(db, workspace_id=workspace.id, user_id=user.id)
    ):
        raise not_found(identity)
    return workspace


def _budget_value(field: str, key: str, value: object) -> int | float | None:
    """One limit as sent: None unsets it; else a positive number (whole for tokens and
    calls), or `InvalidBudget` naming the field and what would be valid."""
    if value is None:
        return None
    whole = key != "max_cost_usd"
    valid = (
        f"a positive whole number up to {_BUDGET_MAX[key]:,}"
        if whole
        else f"a positive number of USD up to {_BUDGET_MAX[key]:,.0f}"
    )
    number: int | float | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float) and math.isfinite(value) and not (whole and value % 1):
        number = int(value) if whole else value
    if number is None or not 0 < number <= _BUDGET_MAX[key]:
        raise InvalidBudget(
            f"{field}.{key} must be {valid} (or null to unset it), got {value!r}",
            details={"field": f"{field}.{key}", "value": repr(value)[:80]},
        )
    return number


def set_budget(
    db: Session,
    *,
    workspace: Workspace,
    user: User,
    defaults: Mapping[str, object] | None = None,
    ceilings: Mapping[str, object] | None = None,
) -> Workspace:
    """Set some of the workspace's budget defaults (its owners or an admin) and ceilings (an
    admin only: they cap what the owners themselves may spend); a key absent stays, None
    unsets it. A default above the ceiling that then holds is refused.

    set_budget(db, workspace=ws, user=admin, ceilings={"max_cost_usd": 20.0})
    set_budget(db, workspace=ws, user=owner, defaults={"max_tokens_total": 200_000})
    """
    member = membership(db, workspace_id=workspace.id, user_id=user.id)
    role = member.role if member is not None else None
    if ceilings and not user.is_admin:
        raise Forbidden(
            "only a platform admin sets a workspace's budget ceilings (they cap what its "
            f"owners and members may spend); you are {_a(role)} of {workspace.identity}",
            details={"field": "ceilings", "role": role},
        )
    if defaults and not (user.is_admin or role == OWNER):
        raise Forbidden(
            f"only an owner of {workspace.identity} or an admin sets its budget defaults; you "
            f"are {_a(role)}; its owners: {', '.join(_owner_names(db, workspace)) or 'none'}",
            details={"field": "defaults", "role": role},
        )
    changes: dict[str, int | float | None] = {}
    for kind, field, given in (
        ("default", "defaults", defaults),
        ("ceiling", "ceilings", ceilings),
    ):
        for key, value in (given or {}).items():
            if key not in _BUDGET_COLUMNS:
                raise InvalidBudget(
                    f"{field}.{key} is not a budget limit; valid: {', '.join(BUDGET_LIMITS)}",
                    details={"field": f"{field}.{key}"},
                )
            changes[f"budget_{kind}_{_BUDGET_COLUMNS[key]}"] = _budget_value(field, key, value)
    # An owner's default and an admin's ceiling set at once must not pass each other's check.
    lock_rows(db, Workspace, Workspace.id == workspace.id)
    db.refresh(workspace)
    for key, column in _BUDGET_COLUMNS.items():
        default = changes.get(
            f"budget_default_{column}", getattr(workspace, f"budget_default_{column}")
        )
        ceiling = changes.get(
            f"budget_ceiling_{column}", getattr(workspace, f"budget_ceiling_{column}")
        )
        if default is not None and ceiling is not None and default > ceiling:
            raise InvalidBudget(
                f"defaults.{key} {_number(default)} is above {workspace.identity}'s ceiling "
                f"({_number(ceiling)}): a default must be at most the ceiling (lower the "
                "default, or an admin raises the ceiling)",
                details={"field": f"defaults.{key}", "default": default, "ceiling": ceiling},
            )
    for name, value in changes.items():
        setattr(workspace, name, value)
    db.flush()
    return workspace


def _a(role: str | None) -> str:
    return f"a {role}" if role else "not a member"


def _number(value: float) -> str:
    """`5000`, `2.5`: a limit as the logs and errors print it."""
    return str(value) if isinstance(value, int) else f"{value:g}"


@dataclass(frozen=True)
class EffectiveBudget:
    """A platform run's limits (None: no limit of that kind) and why any was clamped."""

    limits: dict[str, int | float | None]
    clamped: list[str]
    """One line per limit a ceiling lowered, naming the ceiling (the run's logs get them)."""


def effective_budget(
    evaluation: Mapping[str, Any], workspace: Workspace | None, settings: Settings
) -> EffectiveBudget:
    """A run's budget: per limit its config's value, else the workspace's default, else the
    platform's ceiling; then clamped to the lower of the workspace's and the platform's
    ceilings (`OSMOSIS_BUDGET_MAX_*`).

        effective_budget({"max_cost_usd": 9.0}, ws, Settings(budget_max_cost_usd=5.0))
        # limits["max_cost_usd"] == 5.0, or ws's cost ceiling when that is lower
    """
    limits: dict[str, int | float | None] = {}
    clamped: list[str] = []
    for key, column in _BUDGET_COLUMNS.items():
        platform: int | float | None = getattr(settings, f"budget_{key}")
        own_default = own_ceiling = None
        if workspace is not None:
            own_default = getattr(workspace, f"budget_default_{column}")
            own_ceiling = getattr(workspace, f"budget_ceiling_{column}")
        asked, said = evaluation.get(key), key
        if asked is None and own_default is not None:
            asked, said = own_default, f"the workspace's default {key}"
        value = asked if asked is not None else platform
        by_workspace = own_ceiling is not None and (platform is None or own_ceiling <= platform)
        ceiling = own_ceiling if by_workspace else platform
        if ceiling is not None and (value is None or value > ceiling):
            if asked is not None and workspace is not None and by_workspace:
                clamped.append(
                    f"budget: {said} {_number(asked)} is above the workspace ceiling of "
                    f"{workspace.identity} ({key} {_number(ceiling)}); this run gets "
                    f"{_number(ceiling)}"
                )
            elif asked is not None:
                clamped.append(
                    f"budget: {said} {_number(asked)} is above the platform's ceiling "
                    f"({PLATFORM_CEILING_ENVS[key]}={_number(ceiling)}); this run gets "
                    f"{_number(ceiling)}"
                )
            value = ceiling
        limits[key] = value
    return EffectiveBudget(limits=limits, clamped=clamped)


def raised_budget_clamps(
    evaluation: Mapping[str, Any],
    workspace: Workspace | None,
    settings: Settings,
    raised: Iterable[str],
) -> list[str]:
    """What `eval retry --max-…` is told: the clamp line of each limit in `raised` that a
    ceiling lowers (the worker logs the same line when the run resumes)."""
    lines = effective_budget(evaluation, workspace, settings).clamped
    return [line for line in lines if any(line.startswith(f"budget: {key} ") for key in raised)]
