"""What happens around every REST call, in GitHub's order: injected faults, authentication, the
rate-limit window, the OpenAPI check of the request, the handler (under the state lock), ETags and
304s, rate-limit headers, the OpenAPI check of the answer, and the request log.

Routes opt in by being built on `api_router(...)`; a handler only does its resource's work.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import re
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, Response

from . import faults as F
from .auth import Auth, Identity
from .errors import ApiError, not_found
from .openapi import Spec


@dataclass
class RequestRecord:
    method: str
    path: str
    query: str
    status: int
    login: str | None
    created: bool  # the handler ran and changed something (even if the client then saw a fault)
    fault: str | None
    operation: str | None
    at: float


def needs_jwt(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Marks an endpoint that GitHub serves only to an App authenticated with its JWT."""
    fn.auth = "jwt"  # type: ignore[attr-defined]
    return fn


def spec_path(template: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Checks an endpoint against another documented operation (GitHub's undocumented aliases)."""

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn.spec_path = template  # type: ignore[attr-defined]
        return fn

    return mark


class SpecRoute(APIRoute):
    """A route whose endpoint runs under the state lock and whose calls pass through the Gateway,
    checked against the operation its path names (or the one `spec_path` names)."""

    lock: Any = None

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any):
        lock = self.lock

        @functools.wraps(endpoint)
        def locked(*args: Any, **kw: Any) -> Any:
            with lock:
                return endpoint(*args, **kw)

        super().__init__(path, locked, **kwargs)

    def get_route_handler(self) -> Callable[[Request], Any]:
        inner = super().get_route_handler()
        template = getattr(self.endpoint, "spec_path", None) or re.sub(r":\w+}", "}", self.path)
        jwt = getattr(self.endpoint, "auth", "token") == "jwt"
        method = next(iter(self.methods))

        async def handler(request: Request) -> Response:
            return await request.app.state.gateway.handle(request, inner, method, template, jwt)

        return handler


def api_router(lock: Any) -> APIRouter:
    route = type("LockedSpecRoute", (SpecRoute,), {"lock": lock})
    return APIRouter(route_class=route)


class Gateway:
    def __init__(self, auth: Auth, spec: Spec, faults: F.Faults, owner: str, repo: str):
        self.auth, self.spec, self.faults, self.owner, self.repo = auth, spec, faults, owner, repo
        self.requests: list[RequestRecord] = []
        self.violations: list[str] = []
        self.stopping = threading.Event()

    def violation(self, text: str) -> None:
        self.violations.append(text)

    async def handle(
        self, request: Request, inner: Callable[[Request], Any], method: str, template: str, jwt: bool
    ) -> Response:
        """One REST call from arrival to log line."""
        call = _Call(request, method, template)
        fault = self.faults.take(method, call.path)
        response = None if fault and not fault.apply_first else await self._serve(call, inner, jwt)
        if fault:
            if fault.kind == "timeout":
                await self._hold(fault.seconds)
            response, call.checked = F.answer(fault, self._rate_headers(call.identity)), False
        assert response is not None
        response = _conditional(request, method, response)
        if response.status_code != 304 and template != "/rate_limit" and not (fault and fault.kind == "ratelimit"):
            self.auth.spend(call.identity)
        for key, value in {**self._rate_headers(call.identity), **_github_headers()}.items():
            response.headers.setdefault(key, value)
        if call.checked:
            body = getattr(response, "body", b"")
            for error in self.spec.response_errors(method, template, response.status_code, body):
                self.violation(f"response {method} {call.path} {response.status_code}: {error}")
        operation = (self.spec.operation(method, template) or {}).get("operationId")
        self.requests.append(
            RequestRecord(
                method,
                call.path,
                request.url.query,
                response.status_code,
                call.identity.login if call.identity else None,
                call.created,
                fault.kind if fault else None,
                operation,
                time.time(),
            )
        )
        return response

    async def _serve(self, call: _Call, inner: Callable[[Request], Any], jwt: bool) -> Response:
        """Authenticate, check the request against the description, run the handler; GitHub's
        error answer when any of it says no."""
        request = call.request
        try:
            call.identity = request.state.identity = self.auth.identify(request.headers.get("authorization"), jwt)
            if self.auth.window(call.identity).remaining == 0 and call.template != "/rate_limit":
                raise ApiError(403, f"API rate limit exceeded for {call.identity.login}.")
            owner, repo = request.path_params.get("owner"), request.path_params.get("repo")
            if owner is not None and (owner.lower(), repo.lower()) != (self.owner.lower(), self.repo.lower()):
                raise not_found()
            raw = await request.body()
            try:
                request.state.body = json.loads(raw) if raw.strip() else None
            except ValueError:
                self._refuse(call, ["body is not JSON"])
                raise ApiError(400, "Problems parsing JSON") from None
            errors = self.spec.request_errors(
                call.method,
                call.template,
                dict(request.path_params),
                dict(request.query_params),
                request.state.body,
                bool(raw.strip()),
            )
            if errors:
                self._refuse(call, errors)
                raise ApiError(422, "Invalid request.\n\n" + "\n".join(errors))
            response = await inner(request)
            call.created = call.method != "GET" and response.status_code < 300
            return response
        except ApiError as e:
            return JSONResponse(e.body(), status_code=e.status, headers=e.headers)
        except ClientDisconnect:  # the client went away mid-request (a test killed it): nobody to answer
            call.checked = False
            return Response(status_code=499)
        except Exception:  # a stand-in bug: say so loudly, answer as GitHub's 500 would
            self.violation(f"stand-in error on {call.method} {call.path}:\n{traceback.format_exc()}")
            call.checked = False
            return JSONResponse({"message": "Server Error"}, status_code=500)

    def _refuse(self, call: _Call, errors: list[str]) -> None:
        """The caller broke the description: record it; the refusal itself is GitHub's, not checked."""
        call.checked = False
        self.violation(f"request {call.method} {call.path}: " + "; ".join(errors))

    def unserved(self, request: Request) -> Response:
        """A path the stand-in does not serve: GitHub may, but the bot's use of it is unchecked."""
        path = request.url.path
        self.violation(f"request {request.method} {path}: no such operation in the vendored description")
        self.requests.append(
            RequestRecord(request.method, path, request.url.query, 404, None, False, None, None, time.time())
        )
        return JSONResponse(not_found().body(), status_code=404)

    def _rate_headers(self, identity: Identity | None) -> dict[str, str]:
        window = self.auth.window(identity)
        return {
            "x-ratelimit-limit": str(window.limit),
            "x-ratelimit-remaining": str(window.remaining),
            "x-ratelimit-reset": str(int(window.reset)),
            "x-ratelimit-used": str(window.used),
            "x-ratelimit-resource": "core",
        }

    async def _hold(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not self.stopping.is_set():
            await asyncio.sleep(0.05)


@dataclass
class _Call:
    request: Request
    method: str
    template: str
    identity: Identity | None = None
    created: bool = False  # the handler changed something
    checked: bool = True  # the answer is to be checked against the description

    @property
    def path(self) -> str:
        return self.request.url.path


def _conditional(request: Request, method: str, response: Response) -> Response:
    """ETag every successful GET; answer a matching If-None-Match with an empty 304."""
    if method != "GET" or response.status_code != 200:
        return response
    etag = 'W/"' + hashlib.sha256(getattr(response, "body", b"")).hexdigest() + '"'
    if etag in request.headers.get("if-none-match", ""):
        return Response(status_code=304, headers={"etag": etag})
    response.headers["etag"] = etag
    return response


def _github_headers() -> dict[str, str]:
    return {
        "x-github-request-id": uuid.uuid4().hex[:20].upper(),
        "x-github-media-type": "github.v3; format=json",
        "x-github-api-version-selected": "2022-11-28",
        "vary": "Accept, Authorization, Cookie",
    }
