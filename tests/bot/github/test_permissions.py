"""Who may steer, asked of the GitHub stand-in's collaborator permission endpoint (checked against
GitHub's OpenAPI description): admin, maintain and write may, triage, read and none may not; the
answers are remembered for minutes, a "no" asked again soon for a command; GitHub failing says so."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import github
import pytest
from github_standin import GitHubStandIn

from bot.github.permissions import (
    NO_FOR_S,
    REASK_AFTER_S,
    YES_FOR_S,
    CollaboratorPermissions,
    PermissionUnknown,
    quick_no,
    read_answer,
)

ROLES = {"olga": "admin", "max": "maintain", "alice": "write", "tom": "triage", "rita": "read"}


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[GitHubStandIn]:
    with GitHubStandIn(
        tmp_path / "github", files={"train.py": "lr = 0.01\n"}, collaborators=ROLES, members={"mia"}, private=True
    ) as gh:
        yield gh
        assert gh.violations == [], gh.violations


def lookup(gh: GitHubStandIn, clock: list[float]) -> CollaboratorPermissions:
    repo = github.Github(
        auth=github.Auth.Token("tok-bot"),
        base_url=gh.api_url,
        retry=None,
        seconds_between_requests=None,
        seconds_between_writes=None,
    ).get_repo("octo-org/research")
    return CollaboratorPermissions.for_repository(repo, clock=lambda: clock[0])


def asked(gh: GitHubStandIn, login: str) -> int:
    return len(gh.calls("GET", rf"/collaborators/{login}/permission$"))


def test_admin_maintain_and_write_steer_triage_read_and_none_do_not(standin: GitHubStandIn) -> None:
    permissions = lookup(standin, [0.0])
    verdicts = {login: permissions.access(login) for login in [*ROLES, "mia", "stranger", "octo-org"]}
    assert {login: (a.role, a.may_steer) for login, a in verdicts.items()} == {
        "olga": ("admin", True),
        "max": ("maintain", True),
        "alice": ("write", True),
        "tom": ("triage", False),
        "rita": ("read", False),
        "mia": ("read", False),
        "stranger": ("none", False),
        "octo-org": ("admin", True),
    }


def test_the_legacy_permission_field_is_read_with_the_role_name() -> None:
    # maintain is reported as `permission: write`, triage as `read`; a custom role by its base role
    assert read_answer("x", {"permission": "write", "role_name": "maintain"}).may_steer
    assert not read_answer("x", {"permission": "read", "role_name": "triage"}).may_steer
    custom = read_answer("x", {"permission": "write", "role_name": "release-manager"})
    assert custom.may_steer and custom.role == "release-manager"
    with pytest.raises(PermissionUnknown, match="neither permission nor role_name"):
        read_answer("x", {"user": None})


def test_the_association_is_only_a_quick_no() -> None:
    assert all(quick_no(a) for a in ("NONE", "CONTRIBUTOR", "FIRST_TIME_CONTRIBUTOR", "FIRST_TIMER", "MANNEQUIN", None))
    assert not any(quick_no(a) for a in ("OWNER", "MEMBER", "COLLABORATOR"))


def test_a_yes_is_remembered_for_minutes(standin: GitHubStandIn) -> None:
    clock = [0.0]
    permissions = lookup(standin, clock)
    permissions.access("alice")
    clock[0] += YES_FOR_S - 1
    permissions.access("alice", fresh=True)
    assert asked(standin, "alice") == 1
    standin.state.collaborators["alice"] = "read"  # write access taken away: heard once the yes is old
    clock[0] += 2
    assert not permissions.access("alice").may_steer and asked(standin, "alice") == 2


def test_a_cached_no_is_asked_again_when_a_command_is_denied(standin: GitHubStandIn) -> None:
    clock = [0.0]
    permissions = lookup(standin, clock)
    assert not permissions.access("rita").may_steer
    standin.state.collaborators["rita"] = "write"  # given write access a moment later
    assert not permissions.access("rita", fresh=True).may_steer  # a stream of commands: one question per 10 s
    clock[0] += REASK_AFTER_S
    assert not permissions.access("rita").may_steer  # feedback keeps the no for a minute
    assert permissions.access("rita", fresh=True).may_steer  # her next command is heard
    assert asked(standin, "rita") == 2


def test_a_no_expires_after_a_minute(standin: GitHubStandIn) -> None:
    clock = [0.0]
    permissions = lookup(standin, clock)
    permissions.access("tom")
    standin.state.collaborators["tom"] = "maintain"
    clock[0] += NO_FOR_S
    assert permissions.access("tom").may_steer


def test_github_failing_to_answer_is_unknown_not_no(standin: GitHubStandIn) -> None:
    permissions = lookup(standin, [0.0])
    standin.inject("GET", r"/collaborators/alice/permission$", "502")
    with pytest.raises(PermissionUnknown, match="HTTP 502"):
        permissions.access("alice")
    assert permissions.access("alice").may_steer  # nothing was remembered of the failure
