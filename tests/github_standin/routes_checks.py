"""REST routes for results on commits: check runs (App installations only, as on GitHub) and
commit statuses (anyone with write access), with their per-ref listings."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from . import payloads as P
from .errors import ApiError, unprocessable
from .gateway import api_router, spec_path
from .replies import body, paged, reply, who, window
from .state import State


def router(st: State) -> APIRouter:
    r = api_router(st.lock)

    def commit_of(ref: str) -> str:
        sha = st.repo.resolve(ref)
        if sha is None:
            raise unprocessable(f"No commit found for SHA: {ref}")
        return sha

    @r.post("/repos/{owner}/{repo}/check-runs")
    def create_check_run(request: Request) -> Response:
        caller = who(request)
        if caller.kind != "installation":
            raise ApiError(403, "Resource not accessible by personal access token")
        return reply(P.check_run(st, st.create_check_run(caller.login, body(request))), 201)

    @r.get("/repos/{owner}/{repo}/check-runs/{check_run_id}")
    def get_check_run(check_run_id: int) -> Response:
        return reply(P.check_run(st, st.check_run(check_run_id)))

    @r.patch("/repos/{owner}/{repo}/check-runs/{check_run_id}")
    def update_check_run(check_run_id: int, request: Request) -> Response:
        caller = who(request)
        if caller.kind != "installation":
            raise ApiError(403, "Resource not accessible by personal access token")
        return reply(P.check_run(st, st.update_check_run(check_run_id, caller.login, body(request))))

    @r.get("/repos/{owner}/{repo}/commits/{ref:path}/check-runs")
    def check_runs_for_ref(ref: str, request: Request) -> Response:
        sha, q = commit_of(ref), request.query_params
        runs = sorted((x for x in st.check_runs.values() if x.head_sha == sha), key=lambda x: -x.id)
        runs = [x for x in runs if q.get("check_name") in (None, x.name) and q.get("status") in (None, x.status)]
        if q.get("filter", "latest") == "latest":
            latest: dict[str, object] = {}
            runs = [x for x in runs if latest.setdefault(x.name, x) is x]
        shown, headers = window(request, runs)
        return JSONResponse(
            {"total_count": len(runs), "check_runs": [P.check_run(st, x) for x in shown]}, headers=headers
        )

    @r.post("/repos/{owner}/{repo}/statuses/{sha}")
    def create_status(sha: str, request: Request) -> Response:
        return reply(P.status(st, st.create_status(sha, who(request).login, body(request))), 201)

    def list_statuses(ref: str, request: Request) -> Response:
        sha = commit_of(ref)
        newest_first = sorted((s for s in st.statuses if s.sha == sha), key=lambda s: -s.id)
        return paged(request, [P.status(st, s) for s in newest_first])

    r.get("/repos/{owner}/{repo}/commits/{ref:path}/statuses")(list_statuses)

    @r.get("/repos/{owner}/{repo}/statuses/{ref:path}")
    @spec_path("/repos/{owner}/{repo}/commits/{ref}/statuses")
    def legacy_statuses(ref: str, request: Request) -> Response:
        """PyGithub's Commit.get_statuses() reads this older path, which GitHub still serves."""
        return list_statuses(ref, request)

    @r.get("/repos/{owner}/{repo}/commits/{ref:path}/status")
    def combined_status(ref: str) -> Response:
        return reply(P.combined_status(st, commit_of(ref)))

    return r
