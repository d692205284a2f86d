"""REST routes for GitHub Actions: dispatch a workflow (with `return_run_details`), read, cancel
and delete a workflow run, list its artifacts, and download one (a 302 to a signed blob URL that
the stand-in serves without authentication, as GitHub's artifact storage does), with the JSON
GitHub sends for runs and artifacts.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from . import payloads as P
from .actions import ARTIFACT_RETENTION_S, Actions, Artifact, WorkflowRun
from .errors import ApiError, not_found
from .gateway import api_router
from .replies import body, no_content, reply, who, window
from .state import State


def router(st: State, actions: Actions) -> APIRouter:
    r = api_router(st.lock)
    key = secrets.token_bytes(16)  # signs the blob URLs

    def signature(artifact_id: int) -> str:
        return hmac.new(key, str(artifact_id).encode(), hashlib.sha256).hexdigest()[:32]

    @r.post("/repos/{owner}/{repo}/actions/workflows/{workflow_id}/dispatches")
    def dispatch(workflow_id: str, request: Request) -> Response:
        fields = body(request)
        run = actions.dispatch(workflow_id, fields["ref"], fields.get("inputs") or {}, who(request).login)
        if not fields.get("return_run_details"):
            return no_content()
        return reply(
            {
                "workflow_run_id": run.id,
                "run_url": P.repo_url(st, f"/actions/runs/{run.id}"),
                "html_url": P.html_url(st, f"/actions/runs/{run.id}"),
            }
        )

    @r.get("/repos/{owner}/{repo}/actions/runs/{run_id}")
    def get_run(run_id: int) -> Response:
        return reply(workflow_run(st, actions.run(run_id)))

    @r.delete("/repos/{owner}/{repo}/actions/runs/{run_id}")
    def delete_run(run_id: int) -> Response:
        actions.delete(run_id)
        return no_content()

    @r.post("/repos/{owner}/{repo}/actions/runs/{run_id}/cancel")
    def cancel_run(run_id: int) -> Response:
        actions.cancel(run_id)
        return reply({}, 202)

    @r.get("/repos/{owner}/{repo}/actions/runs/{run_id}/artifacts")
    def list_artifacts(run_id: int, request: Request) -> Response:
        found = [actions.artifacts[a] for a in actions.run(run_id).artifacts if a in actions.artifacts]
        name = request.query_params.get("name")
        found = [a for a in found if name in (None, a.name)]
        shown, headers = window(request, found)
        answer = reply({"total_count": len(found), "artifacts": [artifact(st, a) for a in shown]})
        answer.headers.update(headers)
        return answer

    @r.get("/repos/{owner}/{repo}/actions/artifacts/{artifact_id}/{archive_format}")
    def download_artifact(artifact_id: int, archive_format: str) -> Response:
        if archive_format != "zip":
            raise not_found()
        found = actions.artifact(artifact_id)
        if st.clock() > found.created_at + ARTIFACT_RETENTION_S:
            raise ApiError(410, "Artifact has expired")
        location = f"{st.base_url}/_blobs/artifacts/{artifact_id}.zip?sig={signature(artifact_id)}"
        return Response(status_code=302, headers={"location": location})

    blobs = APIRouter()

    @blobs.get("/_blobs/artifacts/{artifact_id}.zip")
    def artifact_blob(artifact_id: int, sig: str = "") -> Response:
        """Artifact storage: the signature in the URL is the authorisation, no token is needed."""
        with st.lock:
            found = actions.artifacts.get(artifact_id)
            if found is None or not hmac.compare_digest(sig, signature(artifact_id)):
                return Response(
                    "<Error><Code>AuthenticationFailed</Code></Error>", status_code=403, media_type="application/xml"
                )
            return Response(found.data, media_type="application/zip")

    r.include_router(blobs)
    return r


def workflow_run(st: State, run: WorkflowRun) -> dict[str, Any]:
    url = P.repo_url(st, f"/actions/runs/{run.id}")
    commit = st.repo.read_commit(run.head_sha)
    return {
        "id": run.id,
        "name": run.name,
        "node_id": P.node("WFR", run.id),
        "check_suite_id": run.id + 1,
        "check_suite_node_id": P.node("CS", run.id + 1),
        "head_branch": run.head_branch,
        "head_sha": run.head_sha,
        "path": run.path,
        "run_number": run.run_number,
        "run_attempt": 1,
        "referenced_workflows": [],
        "event": "workflow_dispatch",
        "status": run.status,
        "conclusion": run.conclusion,
        "workflow_id": run.workflow_id,
        "url": url,
        "html_url": P.html_url(st, f"/actions/runs/{run.id}"),
        "pull_requests": [],
        "created_at": P.iso(run.created_at),
        "updated_at": P.iso(run.updated_at),
        "actor": P.user(st, run.actor),
        "triggering_actor": P.user(st, run.actor),
        "run_started_at": P.iso(run.run_started_at or run.created_at),
        "jobs_url": f"{url}/jobs",
        "logs_url": f"{url}/logs",
        "check_suite_url": P.repo_url(st, f"/check-suites/{run.id + 1}"),
        "artifacts_url": f"{url}/artifacts",
        "cancel_url": f"{url}/cancel",
        "rerun_url": f"{url}/rerun",
        "previous_attempt_url": None,
        "workflow_url": P.repo_url(st, f"/actions/workflows/{run.workflow_id}"),
        "head_commit": {
            "id": commit.sha,
            "tree_id": commit.tree,
            "message": commit.message,
            "timestamp": P.iso(commit.committer.when),
            "author": {"name": commit.author.name, "email": commit.author.email},
            "committer": {"name": commit.committer.name, "email": commit.committer.email},
        },
        "repository": P.repository(st),
        "head_repository": P.repository(st),
        "display_title": run.display_title,
    }


def artifact(st: State, found: Artifact) -> dict[str, Any]:
    url = P.repo_url(st, f"/actions/artifacts/{found.id}")
    return {
        "id": found.id,
        "node_id": P.node("MDg6QXJ0aWZhY3Q", found.id),
        "name": found.name,
        "size_in_bytes": len(found.data),
        "url": url,
        "archive_download_url": f"{url}/zip",
        "expired": st.clock() > found.created_at + ARTIFACT_RETENTION_S,
        "created_at": P.iso(found.created_at),
        "updated_at": P.iso(found.created_at),
        "expires_at": P.iso(found.created_at + ARTIFACT_RETENTION_S),
        "digest": "sha256:" + hashlib.sha256(found.data).hexdigest(),
        "workflow_run": {
            "id": found.run_id,
            "repository_id": st.repo_id,
            "head_repository_id": st.repo_id,
            "head_branch": found.head_branch,
            "head_sha": found.head_sha,
        },
    }
