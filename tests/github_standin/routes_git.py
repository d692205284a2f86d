"""REST routes over the git data itself: refs, commits, trees and blobs (the Git Data API), file
contents (read, and written one file a commit), commits with their diffs, and comparisons. All of
it reads or writes the bare repository; ref moves go through the state so pull requests and push
webhooks follow."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from . import payloads as P
from . import payloads_git as G
from .errors import not_found, unprocessable
from .events import parse_time
from .gateway import api_router
from .gitrepo import GitError, Person
from .replies import body, no_content, paged, reply, who
from .state import State


def router(st: State) -> APIRouter:
    r = api_router(st.lock)
    repo = st.repo

    def ref_or_404(full: str) -> str:
        sha = repo.refs().get(full)
        if sha is None:
            raise not_found()
        return sha

    @r.get("/repos/{owner}/{repo}/git/ref/{ref:path}")
    def get_ref(ref: str) -> Response:
        return reply(G.git_ref(st, f"refs/{ref}", ref_or_404(f"refs/{ref}")))

    @r.get("/repos/{owner}/{repo}/git/matching-refs/{ref:path}")
    def matching_refs(ref: str, request: Request) -> Response:
        found = [
            G.git_ref(st, name, sha) for name, sha in sorted(repo.refs().items()) if name.startswith(f"refs/{ref}")
        ]
        return paged(request, found)

    @r.post("/repos/{owner}/{repo}/git/refs")
    def create_ref(request: Request) -> Response:
        data = body(request)
        st.create_ref(data["ref"], data["sha"], who(request).login)
        return reply(G.git_ref(st, data["ref"], data["sha"]), 201)

    @r.patch("/repos/{owner}/{repo}/git/refs/{ref:path}")
    def update_ref(ref: str, request: Request) -> Response:
        data = body(request)
        st.update_ref(f"refs/{ref}", data["sha"], bool(data.get("force")), who(request).login)
        return reply(G.git_ref(st, f"refs/{ref}", data["sha"]))

    @r.delete("/repos/{owner}/{repo}/git/refs/{ref:path}")
    def delete_ref(ref: str, request: Request) -> Response:
        st.delete_ref(f"refs/{ref}", who(request).login)
        return no_content()

    @r.get("/repos/{owner}/{repo}/git/commits/{commit_sha}")
    def get_commit(commit_sha: str) -> Response:
        if repo.object_type(commit_sha) != "commit":
            raise not_found()
        return reply(G.git_commit(st, repo.read_commit(commit_sha)))

    @r.post("/repos/{owner}/{repo}/git/commits")
    def create_commit(request: Request) -> Response:
        data, login = body(request), who(request).login
        if repo.object_type(data["tree"]) != "tree":
            raise unprocessable("Tree SHA does not exist")
        for parent in data.get("parents", []):
            if repo.object_type(parent) != "commit":
                raise unprocessable("Parent SHA does not exist or is not a commit object")
        author = _person(data.get("author"), login, st.clock())
        committer = _person(data.get("committer"), login, st.clock()) if data.get("committer") else author
        sha = repo.commit(data["tree"], data.get("parents", []), data["message"], author, committer)
        return reply(G.git_commit(st, repo.read_commit(sha)), 201)

    @r.get("/repos/{owner}/{repo}/git/trees/{tree_sha}")
    def get_tree(tree_sha: str, request: Request) -> Response:
        kind = repo.object_type(tree_sha) if len(tree_sha) == 40 else None
        commit = tree_sha if kind == "commit" else repo.resolve(tree_sha) if kind is None else None
        sha = repo.read_commit(commit).tree if commit else tree_sha if kind == "tree" else None
        if sha is None:
            raise not_found()
        recursive = request.query_params.get("recursive") not in (None, "", "0", "false")
        return reply(G.git_tree(st, sha, recursive))

    @r.post("/repos/{owner}/{repo}/git/trees")
    def create_tree(request: Request) -> Response:
        data = body(request)
        base = data.get("base_tree")
        if base and repo.object_type(base) != "tree":
            raise unprocessable("base_tree is not a valid tree oid")
        entries = [_tree_entry(st, item) for item in data["tree"]]
        try:
            sha = repo.write_tree(base, entries)
        except GitError as e:
            raise unprocessable(f"GitRPC::BadObjectState: {e}") from None
        return reply(G.git_tree(st, sha, False), 201)

    @r.get("/repos/{owner}/{repo}/git/blobs/{file_sha}")
    def get_blob(file_sha: str) -> Response:
        if repo.object_type(file_sha) != "blob":
            raise not_found()
        return reply(G.blob(st, file_sha))

    @r.post("/repos/{owner}/{repo}/git/blobs")
    def create_blob(request: Request) -> Response:
        data = body(request)
        if data.get("encoding", "utf-8") == "base64":
            try:
                raw = base64.b64decode(data["content"])
            except binascii.Error:
                raise unprocessable("content is not valid Base64") from None
        else:
            raw = data["content"].encode()
        sha = repo.write_blob(raw)
        return reply({"url": P.repo_url(st, f"/git/blobs/{sha}"), "sha": sha}, 201)

    @r.get("/repos/{owner}/{repo}/contents/{path:path}")
    def get_contents(path: str, request: Request) -> Response:
        ref = request.query_params.get("ref") or st.default_branch
        commit = repo.resolve(ref)
        entry = repo.entry(commit, path.strip("/")) if commit else None
        if entry is None:
            raise not_found()
        if entry.type == "blob":
            return reply(G.content(st, ref, entry.path, "file", entry.sha, entry.size, repo.read_blob(entry.sha)))
        items = [
            G.content(
                st, ref, f"{entry.path}/{e.path}".strip("/"), "file" if e.type == "blob" else "dir", e.sha, e.size
            )
            for e in repo.tree(entry.sha)
        ]
        return reply(items)

    @r.put("/repos/{owner}/{repo}/contents/{path:path}")
    def put_contents(path: str, request: Request) -> Response:
        """One commit writing one file on a branch (the default one unless `branch` is given),
        authored and committed by the caller unless the body names people."""
        data, login, now = body(request), who(request).login, st.clock()
        try:
            raw = base64.b64decode("".join(data["content"].split()), validate=True)  # line breaks allowed
        except binascii.Error:
            raise unprocessable("content is not valid Base64") from None
        committer = _person(data.get("committer"), login, now)
        author = _person(data["author"], login, now) if data.get("author") else committer
        branch = data.get("branch") or st.default_branch
        path = path.strip("/")
        commit, blob, created = st.put_file(
            branch, path, raw, data.get("sha"), data["message"], author, committer, login
        )
        entry = G.content(st, branch, path, "file", blob, len(raw))
        return reply({"content": entry, "commit": G.git_commit(st, repo.read_commit(commit))}, 201 if created else 200)

    @r.get("/repos/{owner}/{repo}/commits/{ref:path}")
    def get_repo_commit(ref: str) -> Response:
        sha = repo.resolve(ref)
        if sha is None:
            raise unprocessable(f"No commit found for SHA: {ref}")
        return reply(G.commit(st, repo.read_commit(sha), with_files=True))

    @r.get("/repos/{owner}/{repo}/compare/{basehead:path}")
    def compare(basehead: str, request: Request) -> Response:
        base_name, dots, head_name = basehead.partition("...")
        base, head = repo.resolve(base_name), repo.resolve(head_name) if dots else None
        merge_base = repo.merge_base(base, head) if base and head else None
        if merge_base is None:
            raise not_found()
        page = int(request.query_params.get("page", 1))
        per_page = min(int(request.query_params.get("per_page", 250)), 250)
        return reply(G.comparison(st, basehead, base, head, merge_base, page, per_page))

    return r


def _person(given: dict[str, Any] | None, login: str, now: float) -> Person:
    given = given or {}
    when = parse_time(given["date"]) if given.get("date") else now
    return Person(given.get("name") or login, given.get("email") or f"{login}@users.noreply.github.com", int(when))


def _tree_entry(st: State, item: dict[str, Any]) -> dict[str, Any]:
    path = item["path"]
    if path.startswith("/") or path.endswith("/") or not path:
        raise unprocessable(f"tree.path {path!r} is not a valid path")
    if "content" in item and item["content"] is not None:
        return {**item, "sha": st.repo.write_blob(item["content"].encode()), "type": "blob"}
    sha = item.get("sha")
    if sha is not None and st.repo.object_type(sha) != item.get("type"):
        raise unprocessable(f"tree.sha {sha} is not a valid {item.get('type')}")
    return {**item, "sha": sha}
