"""git's smart HTTP protocol, served by git's own `git http-backend` CGI over the bare repository:
clone and fetch for anyone (a public repository), push for a token holder with write access.

A push runs under the state lock and reports the refs it moved, so pull requests, merges and
push webhooks follow exactly as they do for API ref updates.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

from fastapi import APIRouter, Request
from starlette.responses import Response

from .auth import Auth
from .gateway import Gateway, RequestRecord
from .gitrepo import hermetic_env
from .state import State

BACKEND = (
    Path(subprocess.run(["git", "--exec-path"], capture_output=True, text=True, check=True).stdout.strip())
    / "git-http-backend"
)
WRITERS = {"admin", "maintain", "write"}


def router(st: State, auth: Auth, gateway: Gateway) -> APIRouter:
    r = APIRouter()

    @r.api_route("/_git/{owner}/{repo}.git/{rest:path}", methods=["GET", "POST"])
    async def smart_http(owner: str, repo: str, rest: str, request: Request) -> Response:
        identity = auth.from_basic(request.headers.get("authorization"))
        pushing = "git-receive-pack" in (rest, request.query_params.get("service"))
        if (owner, repo) != (st.owner, st.name):
            response = Response("Repository not found.\n", status_code=404)
        elif (pushing or st.private) and identity is None:
            response = Response(
                "Authentication required\n", status_code=401, headers={"WWW-Authenticate": 'Basic realm="GitHub"'}
            )
        elif pushing and identity.kind != "installation" and st.permission(identity.login) not in WRITERS:
            response = Response(f"Permission to {owner}/{repo}.git denied to {identity.login}.\n", status_code=403)
        else:
            env = {
                **hermetic_env(),
                "GIT_PROJECT_ROOT": str(st.git_root),
                "GIT_HTTP_EXPORT_ALL": "1",
                "PATH_INFO": f"/{owner}/{repo}.git/{rest}",
                "REQUEST_METHOD": request.method,
                "QUERY_STRING": request.url.query,
                "CONTENT_TYPE": request.headers.get("content-type", ""),
                "REMOTE_USER": identity.login if identity else "",
                "REMOTE_ADDR": "127.0.0.1",
                "HTTP_CONTENT_ENCODING": request.headers.get("content-encoding", ""),
                "HTTP_GIT_PROTOCOL": request.headers.get("git-protocol", ""),
            }
            data = await request.body()
            env["CONTENT_LENGTH"] = str(len(data))
            if pushing and request.method == "POST":
                output = await asyncio.to_thread(_push, st, env, data, identity.login)
            else:
                output = await asyncio.to_thread(_cgi, env, data)
            response = _response(output)
        gateway.requests.append(
            RequestRecord(
                request.method,
                request.url.path,
                request.url.query,
                response.status_code,
                identity.login if identity else None,
                pushing and request.method == "POST" and response.status_code == 200,
                None,
                "git/smart-http",
                time.time(),
            )
        )
        return response

    return r


def _cgi(env: dict[str, str], data: bytes) -> bytes:
    return subprocess.run([str(BACKEND)], input=data, env=env, capture_output=True, check=False).stdout


def _push(st: State, env: dict[str, str], data: bytes, login: str) -> bytes:
    with st.lock:
        before = st.repo.refs()
        output = _cgi(env, data)
        st.repo.refs_moved()
        st.pushed(before, login)
        return output


def _response(output: bytes) -> Response:
    """A CGI answer (headers, blank line, body) as an HTTP response."""
    split = output.find(b"\r\n\r\n")
    head, rest = (output[:split], output[split + 4 :]) if split >= 0 else output.partition(b"\n\n")[::2]
    status, headers = 200, {}
    for line in head.decode("latin-1").splitlines():
        name, _, value = line.partition(":")
        if name.lower() == "status":
            status = int(value.split()[0])
        elif name:
            headers[name.strip()] = value.strip()
    return Response(rest, status_code=status, headers=headers)
