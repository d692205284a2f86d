"""The stand-in's records: what GitHub keeps besides the git objects, as plain dataclasses.

Times are unix seconds on the stand-in's clock; `payloads.py` turns records into GitHub's JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Pull:
    number: int
    id: int
    user: str
    title: str
    body: str | None
    head: str  # branch name in this repository
    base: str
    head_sha: str
    base_sha: str
    created_at: float
    updated_at: float
    draft: bool = False
    # open -> closed (closed by hand, or its head branch deleted) -> open again (reopened);
    # open -> closed with merged=True (head reachable from base), which is final
    state: str = "open"
    merged: bool = False
    merged_at: float | None = None
    merged_by: str | None = None
    merge_commit_sha: str | None = None
    closed_at: float | None = None
    closed_by: str | None = None  # who closed it (the issue's closed_by)
    labels: list[str] = field(default_factory=list)


@dataclass
class Issue:
    """An issue that is not a pull request (pull requests are issues too: see Pull)."""

    number: int
    id: int
    user: str
    title: str
    body: str | None
    created_at: float
    updated_at: float
    state: str = "open"  # open -> closed (completed or not_planned) -> open again (reopened)
    state_reason: str | None = None
    closed_at: float | None = None
    closed_by: str | None = None
    labels: list[str] = field(default_factory=list)
    via_app: bool = False  # opened with an installation token: performed_via_github_app


@dataclass
class Comment:
    id: int
    number: int
    user: str
    body: str
    created_at: float
    updated_at: float
    via_app: bool = False  # written with an installation token: performed_via_github_app


@dataclass
class IssueEvent:
    """One entry of an issue's (or a pull request's) event list, as `GET .../issues/{n}/events`
    shows it: closed, reopened or merged, with who did it."""

    id: int
    number: int
    actor: str
    event: str  # closed | reopened | merged
    created_at: float
    commit_id: str | None = None  # merged (and the close a merge makes): the merged head
    state_reason: str | None = None  # an issue's close: completed, not_planned, duplicate; reopen: reopened


@dataclass
class Reaction:
    id: int
    comment_id: int
    user: str
    content: str
    created_at: float


@dataclass
class Review:
    id: int
    number: int
    user: str
    body: str
    state: str  # APPROVED | CHANGES_REQUESTED | COMMENTED
    commit_id: str
    submitted_at: float


@dataclass
class Label:
    id: int
    name: str
    color: str
    description: str | None
    default: bool = False


@dataclass
class CheckRun:
    id: int
    suite_id: int
    name: str
    head_sha: str
    status: str
    conclusion: str | None
    started_at: float | None
    completed_at: float | None
    external_id: str
    details_url: str | None
    output: dict[str, Any]
    actions: list[dict[str, str]]
    creator: str  # the login whose token created it (the app's bot)


@dataclass
class Status:
    id: int
    sha: str
    state: str
    target_url: str | None
    description: str | None
    context: str
    creator: str
    created_at: float
