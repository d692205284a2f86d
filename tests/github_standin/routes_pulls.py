"""REST routes for pull requests and their issue side: pulls (list, open, read, edit), reviews,
comments (on pull requests and plain issues alike), reactions to comments, and labels (pull requests
only). The issue view itself is in routes_issues."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from . import payloads as P
from .events import parse_time
from .gateway import api_router
from .replies import body, no_content, paged, reply, who
from .state import State

PULL_SORTS = {
    "created": lambda p: p.created_at,
    "updated": lambda p: p.updated_at,
    "popularity": lambda p: p.number,
    "long-running": lambda p: p.created_at,
}


def router(st: State) -> APIRouter:
    r = api_router(st.lock)

    @r.get("/repos/{owner}/{repo}/pulls")
    def list_pulls(request: Request) -> Response:
        q = request.query_params
        state, head, base = q.get("state", "open"), q.get("head"), q.get("base")
        found = [
            p
            for p in st.pulls.values()
            if state in ("all", p.state)
            and (base is None or p.base == base)
            and (head is None or f"{st.owner}:{p.head}" == head or (":" not in head and p.head == head))
        ]
        sort = q.get("sort", "created")
        found.sort(key=PULL_SORTS[sort], reverse=q.get("direction", "desc") == "desc")
        return paged(request, [P.pull_request(st, p, detail=False) for p in found])

    @r.post("/repos/{owner}/{repo}/pulls")
    def open_pull(request: Request) -> Response:
        data = body(request)
        pull = st.open_pull(
            who(request).login,
            data.get("title") or "",
            data["head"],
            data["base"],
            data.get("body"),
            bool(data.get("draft")),
        )
        return reply(P.pull_request(st, pull), 201)

    @r.get("/repos/{owner}/{repo}/pulls/{pull_number}")
    def get_pull(pull_number: int) -> Response:
        return reply(P.pull_request(st, st.pull(pull_number)))

    @r.patch("/repos/{owner}/{repo}/pulls/{pull_number}")
    def edit_pull(pull_number: int, request: Request) -> Response:
        return reply(P.pull_request(st, st.edit_pull(pull_number, who(request).login, body(request))))

    @r.get("/repos/{owner}/{repo}/pulls/{pull_number}/reviews")
    def list_reviews(pull_number: int, request: Request) -> Response:
        st.pull(pull_number)
        return paged(request, [P.review(st, rv) for rv in st.reviews.values() if rv.number == pull_number])

    # comments (the repository-wide routes first: "comments" is not an issue number) ---------

    @r.get("/repos/{owner}/{repo}/issues/comments")
    def repo_comments(request: Request) -> Response:
        q = request.query_params
        since = parse_time(q["since"]) if q.get("since") else None
        found = [c for c in st.comments.values() if since is None or c.updated_at >= since]
        sort = q.get("sort")
        if sort:
            key = (lambda c: c.updated_at) if sort == "updated" else (lambda c: c.created_at)
            found.sort(key=lambda c: (key(c), c.id), reverse=q.get("direction", "desc") == "desc")
        else:
            found.sort(key=lambda c: c.id)
        return paged(request, [P.comment(st, c) for c in found])

    @r.get("/repos/{owner}/{repo}/issues/comments/{comment_id}")
    def get_comment(comment_id: int) -> Response:
        return reply(P.comment(st, st.comment(comment_id)))

    @r.patch("/repos/{owner}/{repo}/issues/comments/{comment_id}")
    def edit_comment(comment_id: int, request: Request) -> Response:
        return reply(P.comment(st, st.edit_comment(comment_id, body(request)["body"], who(request).login)))

    @r.delete("/repos/{owner}/{repo}/issues/comments/{comment_id}")
    def delete_comment(comment_id: int, request: Request) -> Response:
        st.delete_comment(comment_id, who(request).login)
        return no_content()

    @r.get("/repos/{owner}/{repo}/issues/comments/{comment_id}/reactions")
    def list_reactions(comment_id: int, request: Request) -> Response:
        st.comment(comment_id)
        content = request.query_params.get("content")
        found = [x for x in st.reactions.values() if x.comment_id == comment_id and content in (None, x.content)]
        return paged(request, [P.reaction(st, x) for x in found])

    @r.post("/repos/{owner}/{repo}/issues/comments/{comment_id}/reactions")
    def react(comment_id: int, request: Request) -> Response:
        reaction, new = st.react(comment_id, who(request).login, body(request)["content"])
        return reply(P.reaction(st, reaction), 201 if new else 200)

    @r.get("/repos/{owner}/{repo}/issues/{issue_number}/comments")
    def issue_comments(issue_number: int, request: Request) -> Response:
        st.commented(issue_number)
        since = request.query_params.get("since")
        found = [
            c
            for c in st.comments.values()
            if c.number == issue_number and (since is None or c.updated_at >= parse_time(since))
        ]
        return paged(request, [P.comment(st, c) for c in sorted(found, key=lambda c: c.id)])

    @r.post("/repos/{owner}/{repo}/issues/{issue_number}/comments")
    def add_comment(issue_number: int, request: Request) -> Response:
        caller = who(request)
        comment = st.add_comment(
            issue_number, caller.login, body(request)["body"], via_app=caller.kind == "installation"
        )
        return reply(P.comment(st, comment), 201)

    # labels ---------------------------------------------------------------------------------

    @r.get("/repos/{owner}/{repo}/issues/{issue_number}/labels")
    def issue_labels(issue_number: int, request: Request) -> Response:
        return paged(request, [P.label(st, st.label(n)) for n in st.pull(issue_number).labels])

    @r.post("/repos/{owner}/{repo}/issues/{issue_number}/labels")
    def add_labels(issue_number: int, request: Request) -> Response:
        data = body(request)
        given = data if isinstance(data, list) else data.get("labels", [])
        names = [x if isinstance(x, str) else x["name"] for x in given]
        st.add_labels(issue_number, names, who(request).login)
        return reply([P.label(st, st.label(n)) for n in st.pull(issue_number).labels])

    @r.delete("/repos/{owner}/{repo}/issues/{issue_number}/labels/{name}")
    def remove_label(issue_number: int, name: str, request: Request) -> Response:
        st.remove_label(issue_number, name, who(request).login)
        return reply([P.label(st, st.label(n)) for n in st.pull(issue_number).labels])

    @r.get("/repos/{owner}/{repo}/labels/{name}")
    def get_label(name: str) -> Response:
        return reply(P.label(st, st.label(name)))

    @r.post("/repos/{owner}/{repo}/labels")
    def create_label(request: Request) -> Response:
        data = body(request)
        label = st.create_label(data["name"], data.get("color") or "ededed", data.get("description"))
        return reply(P.label(st, label), 201)

    return r
