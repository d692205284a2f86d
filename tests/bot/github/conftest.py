"""A fake of who may steer (bot.github.permissions.Permissions), and the GitHub inbox handler wired
with it for the research repository `octo/research`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bot.github.handlers import GitHubEvents
from bot.github.permissions import STEERING_ROLES, Access, PermissionUnknown

REPOSITORY = "octo/research"


class FakePermissions:
    """Roles by login, as GitHub's collaborator permission endpoint would report them (a login not
    listed has none). `down` makes every question fail as GitHub being unreachable would; `asked`
    records each question (login, fresh)."""

    def __init__(self, roles: dict[str, str]) -> None:
        self.roles = dict(roles)
        self.down = False
        self.asked: list[tuple[str, bool]] = []

    def access(self, login: str, *, fresh: bool = False) -> Access:
        self.asked.append((login, fresh))
        if self.down:
            raise PermissionUnknown(f"GitHub answered HTTP 502 when asked about {login}'s permission")
        role = self.roles.get(login, "none")
        return Access(login, role, role in STEERING_ROLES)


@pytest.fixture
def permissions() -> FakePermissions:
    return FakePermissions({"alice": "write", "olga": "admin", "max": "maintain", "rita": "read",
                            "tom": "triage", "mia": "read"})


@pytest.fixture
def github_events(permissions: FakePermissions) -> Iterator[GitHubEvents]:
    """The handler of `github` inbox entries for REPOSITORY, asking `permissions`; the unwired
    default is put back afterwards."""
    clock = [0.0]
    events = GitHubEvents(REPOSITORY, permissions, clock=lambda: clock[0]).install()
    events.now = clock  # type: ignore[attr-defined] - the test moves it: events.now[0] += seconds
    try:
        yield events
    finally:
        GitHubEvents().install()
