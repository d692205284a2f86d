"""REST routes for issues: list (issues and pull requests alike, as GitHub lists them), open, read,
edit, and an issue's events (who closed, reopened or merged it). A pull request's number reads and
edits its issue side; comments of an issue are served by routes_pulls (for both kinds of number),
labels there too (for pull requests' numbers only).

Filters the stand-in does not implement (milestone, assignee, mentioned, type) fail loudly as a
stand-in error rather than being ignored, so a test never passes on a filter that did nothing.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from . import payloads as P
from .events import parse_time
from .gateway import api_router
from .model import Issue, Pull
from .replies import body, paged, reply, who
from .state import State

UNFILTERED = ("milestone", "assignee", "mentioned", "type", "issue_field_values")


def router(st: State) -> APIRouter:
    r = api_router(st.lock)

    def shown(item: Issue | Pull) -> dict[str, Any]:
        return P.plain_issue(st, item) if isinstance(item, Issue) else P.issue(st, item)

    def comments(item: Issue | Pull) -> int:
        return sum(c.number == item.number for c in st.comments.values())

    @r.get("/repos/{owner}/{repo}/issues")
    def list_issues(request: Request) -> Response:
        q = request.query_params
        unsupported = [name for name in UNFILTERED if name in q]
        if unsupported:
            raise NotImplementedError(f"the stand-in does not filter issues by {', '.join(unsupported)}")
        state, creator = q.get("state", "open"), q.get("creator")
        labels = {name.strip().lower() for name in q.get("labels", "").split(",") if name.strip()}
        since = parse_time(q["since"]) if q.get("since") else None
        items: list[Issue | Pull] = [*st.issues.values(), *st.pulls.values()]
        found = [
            i
            for i in items
            if state in ("all", i.state)
            and labels <= {n.lower() for n in i.labels}
            and (creator is None or i.user.lower() == creator.lower())
            and (since is None or i.updated_at >= since)
        ]
        sort = q.get("sort", "created")
        key = {"created": lambda i: i.created_at, "updated": lambda i: i.updated_at, "comments": comments}[sort]
        found.sort(key=lambda i: (key(i), i.number), reverse=q.get("direction", "desc") == "desc")
        return paged(request, [shown(i) for i in found])

    @r.post("/repos/{owner}/{repo}/issues")
    def open_issue(request: Request) -> Response:
        data, caller = body(request), who(request)
        names = [x if isinstance(x, str) else x["name"] for x in data.get("labels") or []]
        issue = st.open_issue(
            caller.login, str(data["title"]), data.get("body"), names, via_app=caller.kind == "installation"
        )
        return reply(P.plain_issue(st, issue), 201)

    @r.get("/repos/{owner}/{repo}/issues/{issue_number}")
    def get_issue(issue_number: int) -> Response:
        return reply(shown(st.issue(issue_number) if issue_number not in st.pulls else st.pull(issue_number)))

    @r.get("/repos/{owner}/{repo}/issues/{issue_number}/events")
    def issue_events(issue_number: int, request: Request) -> Response:
        st.commented(issue_number)  # 404 for an unknown number, 410 for a deleted issue
        found = sorted((e for e in st.issue_events.values() if e.number == issue_number), key=lambda e: e.id)
        return paged(request, [P.issue_event(st, e) for e in found])

    @r.patch("/repos/{owner}/{repo}/issues/{issue_number}")
    def edit_issue(issue_number: int, request: Request) -> Response:
        data, actor = body(request), who(request).login
        if issue_number not in st.pulls:
            return reply(P.plain_issue(st, st.edit_issue(issue_number, actor, data)))
        pull = st.pull(issue_number)
        st.edit_pull(issue_number, actor, {k: data[k] for k in ("title", "body", "state") if data.get(k) is not None})
        if "labels" in data:
            wanted = [x if isinstance(x, str) else x["name"] for x in data["labels"]]
            for name in [n for n in pull.labels if n.lower() not in {w.lower() for w in wanted}]:
                st.remove_label(issue_number, name, actor)
            st.add_labels(issue_number, wanted, actor)
        return reply(P.issue(st, pull))

    return r
