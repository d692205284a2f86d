"""Who may steer the bot: people with write access to the research repository (the roles admin,
maintain and write), asked of GitHub and remembered for a few minutes.

A comment's author association (OWNER, MEMBER, COLLABORATOR) is not write access: it includes
collaborators with the read or triage role and organization members who cannot push. So the
association only ever says "no" quickly (NONE, CONTRIBUTOR, FIRST_TIME_CONTRIBUTOR, ... never
steer); a "yes" comes from `GET /repos/{owner}/{repo}/collaborators/{username}/permission`, which
an App may call with the metadata permission every installation has.

Reading GitHub's answer. `permission` is the legacy base role: admin, write, read or none, where
maintain is reported as write and triage as read (and a custom role as the base role it extends);
`role_name` is the exact role (admin, maintain, write, triage, read, or a custom role's name). So
admin or write in `permission` is exactly "admin, maintain or write"; `role_name` is what the log
and the reply name. A user GitHub does not know (404) has no access.

Caching (CollaboratorPermissions). A "yes" is remembered for YES_FOR_S (5 minutes: write access
taken away stops steering within that time); a "no" for NO_FOR_S (1 minute), and a command from
someone remembered as "no" asks again once the "no" is REASK_AFTER_S old (10 s), so a person just
given write access is heard at their next command while a stream of denied commands costs at most
one request per REASK_AFTER_S per person. The cache lives in memory: a restart asks again.

Failing. When GitHub cannot answer (after the client's own retries) `access()` raises
PermissionUnknown; the handler leaves the event in the inbox for a later tick (bot.loop.inbox.Deferred)
rather than guess either way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

import requests
from github import GithubException

log = logging.getLogger(__name__)

STEERING_ROLES = frozenset({"admin", "maintain", "write"})
LEGACY_STEERING = frozenset({"admin", "write"})  # `permission`: maintain reads write, triage reads read
WORTH_ASKING = frozenset({"OWNER", "MEMBER", "COLLABORATOR"})  # any other association never steers
YES_FOR_S = 300.0
NO_FOR_S = 60.0
REASK_AFTER_S = 10.0


class PermissionUnknown(RuntimeError):
    """GitHub could not say what access a person has; the message says why."""


@dataclass(frozen=True)
class Access:
    login: str
    role: str  # admin, maintain, write, triage, read, none, or a custom role's name
    may_steer: bool


class Permissions(Protocol):
    def access(self, login: str, *, fresh: bool = False) -> Access:
        """What `login` may do on the research repository; `fresh` asks again over a remembered
        "no". Raises PermissionUnknown when GitHub cannot say."""
        ...


def quick_no(association: str | None) -> bool:
    """True when a comment's author association alone rules out write access."""
    return (association or "").upper() not in WORTH_ASKING


def read_answer(login: str, answer: Any) -> Access:
    """The Access in GitHub's answer to GET .../collaborators/{login}/permission."""
    if not isinstance(answer, dict):
        raise PermissionUnknown(f"GitHub's answer about {login}'s permission is not an object")
    permission, role = answer.get("permission"), answer.get("role_name")
    if not isinstance(permission, str) and not isinstance(role, str):
        raise PermissionUnknown(f"GitHub's answer about {login}'s permission has neither permission nor role_name")
    may = (permission or "").lower() in LEGACY_STEERING or (role or "").lower() in STEERING_ROLES
    return Access(login, role if isinstance(role, str) else str(permission), may)


class CollaboratorPermissions:
    """Permissions asked of GitHub through a `get(path)` that returns the JSON answer (see
    `for_repository`), remembered as the module docstring says."""

    def __init__(
        self,
        get: Callable[[str], Any],
        *,
        clock: Callable[[], float] = time.monotonic,
        yes_for_s: float = YES_FOR_S,
        no_for_s: float = NO_FOR_S,
        reask_after_s: float = REASK_AFTER_S,
    ) -> None:
        self._get = get
        self._clock = clock
        self._yes_for_s, self._no_for_s, self._reask_after_s = yes_for_s, no_for_s, reask_after_s
        self._known: dict[str, tuple[Access, float]] = {}  # login (lower case) -> (answer, when asked)

    @classmethod
    def for_repository(cls, repo: Any, **kwargs: Any) -> CollaboratorPermissions:
        """Ask about one PyGithub Repository, through its requester (the client's sign-in and retries)."""

        def get(path: str) -> Any:
            return repo.requester.requestJsonAndCheck("GET", f"{repo.url}{path}")[1]

        return cls(get, **kwargs)

    def access(self, login: str, *, fresh: bool = False) -> Access:
        key = login.lower()
        now = self._clock()
        known = self._known.get(key)
        if known is not None:
            answer, at = known
            age = now - at
            if answer.may_steer and age < self._yes_for_s:
                return answer
            if not answer.may_steer and age < (self._reask_after_s if fresh else self._no_for_s):
                return answer
        answer = self._ask(login)
        self._known[key] = (answer, now)
        log.info(
            "GitHub: %s has the %s role on the research repository (%s)",
            login,
            answer.role,
            "may steer" if answer.may_steer else "may not steer",
        )
        return answer

    def _ask(self, login: str) -> Access:
        try:
            return read_answer(login, self._get(f"/collaborators/{quote(login, safe='')}/permission"))
        except GithubException as error:
            if error.status == 404:
                return Access(login, "none", False)
            raise PermissionUnknown(
                f"GitHub answered HTTP {error.status} when asked about {login}'s permission"
            ) from error
        except (requests.RequestException, OSError) as error:
            raise PermissionUnknown(
                f"GitHub could not be asked about {login}'s permission ({type(error).__name__}: {error})"
            ) from error
