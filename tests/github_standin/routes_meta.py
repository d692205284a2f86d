"""REST routes about who is who: the repository, the authenticated user, rate limits,
collaborator permissions, and the GitHub App (itself, its installation, installation tokens)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from . import payloads as P
from .auth import Auth
from .errors import ApiError, not_found
from .gateway import api_router, needs_jwt
from .replies import reply, who
from .state import State

LEGACY_PERMISSION = {
    "admin": "admin",
    "maintain": "write",
    "write": "write",
    "triage": "read",
    "read": "read",
    "none": "none",
}


def router(st: State, auth: Auth) -> APIRouter:
    r = api_router(st.lock)

    @r.get("/repos/{owner}/{repo}")
    def get_repo() -> Response:
        return reply(P.repository(st))

    @r.get("/user")
    def get_user(request: Request) -> Response:
        if who(request).kind != "user":
            raise ApiError(403, "Resource not accessible by integration")
        return reply(P.private_user(st, who(request).login))

    @r.get("/rate_limit")
    def rate_limit(request: Request) -> Response:
        window = auth.window(who(request))
        core = {
            "limit": window.limit,
            "remaining": window.remaining,
            "reset": int(window.reset),
            "used": window.used,
            "resource": "core",
        }
        quiet = {"limit": 30, "remaining": 30, "reset": int(window.reset), "used": 0}
        return reply(
            {
                "resources": {
                    "core": core,
                    "search": {**quiet, "resource": "search"},
                    "graphql": {**quiet, "limit": 5000, "remaining": 5000, "resource": "graphql"},
                },
                "rate": core,
            }
        )

    @r.get("/repos/{owner}/{repo}/collaborators/{username}/permission")
    def permission(username: str) -> Response:
        role = st.permission(username)
        user = {
            **P.user(st, username),
            "role_name": role,
            "permissions": {
                "admin": role == "admin",
                "maintain": role in ("admin", "maintain"),
                "push": role in ("admin", "maintain", "write"),
                "triage": role not in ("read", "none"),
                "pull": role != "none",
            },
        }
        return reply({"permission": LEGACY_PERMISSION[role], "role_name": role, "user": user})

    @r.get("/app")
    @needs_jwt
    def get_app() -> Response:
        return reply(P.integration(st))

    @r.get("/repos/{owner}/{repo}/installation")
    @needs_jwt
    def repo_installation() -> Response:
        return reply(P.installation(st))

    @r.post("/app/installations/{installation_id}/access_tokens")
    @needs_jwt
    def access_token(installation_id: int) -> Response:
        if not st.app or installation_id != st.app["installation_id"]:
            raise not_found()
        token, expires_at = auth.issue_installation_token()
        return reply(
            {
                "token": token,
                "expires_at": P.iso(expires_at),
                "permissions": dict(st.app["permissions"]),
                "repository_selection": "selected",
            },
            201,
        )

    return r
