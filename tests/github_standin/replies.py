"""Small helpers every route uses: the caller, the checked JSON body, and GitHub-style answers
(JSON with a status, empty 204s, and pages with Link headers)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from fastapi import Request
from starlette.responses import JSONResponse, Response

from .auth import Identity

MAX_PER_PAGE = 100


def who(request: Request) -> Identity:
    return request.state.identity


def body(request: Request) -> Any:
    """The JSON body, already checked against the operation's schema by the gateway."""
    return request.state.body if request.state.body is not None else {}


def reply(data: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(data, status_code=status)


def no_content() -> Response:
    return Response(status_code=204)


def window(request: Request, items: list[Any]) -> tuple[list[Any], dict[str, str]]:
    """The page of `items` that page/per_page ask for, and the Link header GitHub would send."""
    query = request.query_params
    per_page = min(max(int(query.get("per_page", 30)), 1), MAX_PER_PAGE)
    page = max(int(query.get("page", 1)), 1)
    last = max((len(items) + per_page - 1) // per_page, 1)
    base = str(request.url.replace(query=""))

    def link(n: int, rel: str) -> str:
        return f'<{base}?{urlencode({**query, "per_page": per_page, "page": n})}>; rel="{rel}"'

    rels = ([link(page - 1, "prev"), link(1, "first")] if page > 1 else []) + (
        [link(page + 1, "next"), link(last, "last")] if page < last else []
    )
    return items[(page - 1) * per_page : page * per_page], ({"link": ", ".join(rels)} if rels else {})


def paged(request: Request, items: list[Any]) -> JSONResponse:
    shown, headers = window(request, items)
    return JSONResponse(shown, headers=headers)
