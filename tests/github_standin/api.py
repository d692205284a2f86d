"""The stand-in's web application: the REST routes at the root (as api.github.com serves them),
git smart HTTP under /_git/, and a catch-all that reports any path the stand-in does not serve.

Route order matters where GitHub's paths nest: /commits/{ref}/check-runs must be tried before
/commits/{ref}, whose {ref} may itself contain slashes, and /issues/comments (routes_pulls)
before /issues/{issue_number} (routes_issues), which would take "comments" for a number.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from starlette.responses import Response

from . import (
    git_http,
    routes_actions,
    routes_checks,
    routes_git,
    routes_issues,
    routes_meta,
    routes_pulls,
)
from .actions import Actions
from .auth import Auth
from .gateway import Gateway
from .state import State


def build(st: State, auth: Auth, gateway: Gateway, actions: Actions) -> FastAPI:
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    app.state.gateway = gateway
    app.include_router(git_http.router(st, auth, gateway))
    app.include_router(routes_meta.router(st, auth))
    app.include_router(routes_checks.router(st))
    app.include_router(routes_git.router(st))
    app.include_router(routes_pulls.router(st))
    app.include_router(routes_issues.router(st))
    app.include_router(routes_actions.router(st, actions))

    @app.api_route("/{rest:path}", methods=["GET", "POST", "PATCH", "PUT", "DELETE"])
    def unserved(request: Request) -> Response:
        return gateway.unserved(request)

    return app
