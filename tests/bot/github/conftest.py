"""A fake of who may steer (bot.github.permissions.Permissions), the GitHub inbox handler wired with
it for the research repository `octo/research`, and the router that joins it with the loop's own
inputs, as bot.app.serve joins them."""

from __future__ import annotations

import pytest

from bot.core.router import Router
from bot.github.handlers import GitHubEvents, InboxHandler
from bot.github.permissions import STEERING_ROLES, Access, PermissionUnknown
from bot.loop import inbox

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
    return FakePermissions(
        {"alice": "write", "olga": "admin", "max": "maintain", "rita": "read", "tom": "triage", "mia": "read"}
    )


@pytest.fixture
def github_events(permissions: FakePermissions) -> GitHubEvents:
    """The handler of `github` inbox entries for REPOSITORY, asking `permissions`."""
    clock = [0.0]
    events = GitHubEvents(REPOSITORY, permissions, clock=lambda: clock[0], loop=inbox.router)
    events.now = clock  # type: ignore[attr-defined] - the test moves it: events.now[0] += seconds
    return events


@pytest.fixture
def routes(github_events: GitHubEvents) -> Router[InboxHandler]:
    """The loop's own inputs and GitHub's events, joined as bot.app.serve joins them."""
    return Router(inbox.router, github_events.router())
