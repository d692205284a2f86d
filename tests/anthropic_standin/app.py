"""The stand-in's web application: POST /v1/messages and POST /v1/messages/count_tokens, in the
API's order: the request log, authentication, the anthropic-version header, the body's checks, then
"the model" (the script), and the answer as the API shapes it.

A request that fails authentication or the checks never reaches the script; a scripted error
(429, 529, ...) does, and takes its turn like any reply.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response

from . import tokens, validate
from .script import Reply

if TYPE_CHECKING:
    from .server import AnthropicStandIn

VERSION = re.compile(r"^\d{4}-\d{2}-\d{2}$")
STREAMING = (
    "stream: the Anthropic stand-in answers only non-streaming requests; call messages.create without "
    "stream=True (or teach the stand-in SSE)"
)


@dataclass
class RequestRecord:
    number: int  # 1-based, over every request the stand-in received
    path: str
    headers: dict[str, str]  # names in lower case
    body: Any  # the parsed JSON, None when the body was not JSON
    status: int | None = None
    reply: int | None = None  # the script entry that answered (1-based), if one did
    response: dict[str, Any] | None = None  # the JSON answered


def build(s: AnthropicStandIn) -> FastAPI:
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

    @app.post("/v1/messages")
    async def create(request: Request) -> Response:
        record, refused = await _admit(s, request)
        if refused is not None:
            return refused
        body = record.body
        if isinstance(body, dict) and body.get("stream") is True:
            return _invalid(s, record, [STREAMING])
        problems = validate.check_create(body)
        if problems:
            return _invalid(s, record, problems)
        try:
            taken = s.script.take(body)
        except Exception as err:  # noqa: BLE001 -- a callable entry failed: show the test its own error
            s._violation(record, f"the script's callable raised {err!r}\n{traceback.format_exc()}")
            return _error(
                record, 500, "api_error", f"the stand-in's script entry raised {err!r}", {"x-should-retry": "false"}
            )
        if taken is None:
            message = (
                f"the stand-in's script has ended: all {s.script.taken} scripted replies were used and "
                f"request #{record.number} asked for one more; add replies (AnthropicStandIn(replies=...) "
                "or .add()) or find out why the bot called again"
            )
            s._violation(record, message)
            return _error(record, 500, "api_error", message, {"x-should-retry": "false"})
        record.reply, reply = taken
        await _sleep(reply.delay_s, s._stopping)
        if reply.is_error:
            return _error(record, reply.status, reply.error_type or "api_error", reply.message or "", reply.headers)
        return _answer(record, 200, _message(s, record, body, reply))

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Response:
        record, refused = await _admit(s, request)
        if refused is not None:
            return refused
        problems = validate.check_count_tokens(record.body)
        if problems:
            return _invalid(s, record, problems)
        return _answer(record, 200, {"input_tokens": tokens.input_tokens(record.body)})

    @app.api_route("/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    async def unserved(request: Request, rest: str) -> Response:
        record, refused = await _admit(s, request)
        if refused is not None:
            return refused
        s._violation(
            record,
            f"{request.method} /{rest} is not served by the Anthropic stand-in "
            "(it serves POST /v1/messages and /v1/messages/count_tokens)",
        )
        return _error(record, 404, "not_found_error", f"Not found: {request.method} /{rest}")

    return app


async def _admit(s: AnthropicStandIn, request: Request) -> tuple[RequestRecord, Response | None]:
    """Logs the request; answers it at once when the key, the version header or the JSON is wrong."""
    raw = await request.body()
    try:
        body = json.loads(raw) if raw else None
    except ValueError:
        body = None
    record = s._log(request.url.path, {k.lower(): v for k, v in request.headers.items()}, body)
    headers = record.headers
    bearer = headers.get("authorization", "")
    key = headers.get("x-api-key") or (bearer[len("Bearer ") :] if bearer.startswith("Bearer ") else None)
    if not key:
        return record, _error(record, 401, "authentication_error", "x-api-key header is required")
    if key != s.api_key:
        return record, _error(record, 401, "authentication_error", "invalid x-api-key")
    version = headers.get("anthropic-version")
    if not version or not VERSION.match(version):
        problem = (
            "anthropic-version: header is required"
            if not version
            else f"anthropic-version: {version!r} is not a valid version (a date such as 2023-06-01)"
        )
        return record, _invalid(s, record, [problem])
    if request.method == "POST" and body is None:
        return record, _invalid(s, record, ["There was an error parsing the body: send a JSON object"])
    return record, None


def _message(s: AnthropicStandIn, record: RequestRecord, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
    """The Message object: the reply's blocks (tool_use ids filled in), usage with the cache's say."""
    content = []
    for block in reply.blocks:
        block = dict(block)
        if block.get("type") == "tool_use" and not block.get("id"):
            block["id"] = s._new_id("toolu")
        content.append(block)
    out = tokens.output_tokens(content)
    if out > body["max_tokens"] and reply.stop_reason != "max_tokens":
        s._violation(
            record,
            f"script entry #{record.reply} is about {out} output tokens, over the request's "
            f"max_tokens={body['max_tokens']}: the real model would stop early with stop_reason "
            "'max_tokens'; raise max_tokens in the bot or script a shorter reply",
        )
    usage = {**s.cache.usage(body), "output_tokens": out, "service_tier": "standard"}
    return {
        "id": s._new_id("msg"),
        "type": "message",
        "role": "assistant",
        "model": body["model"],
        "content": content,
        "stop_reason": reply.stop_reason,
        "stop_sequence": reply.stop_sequence,
        "usage": usage,
    }


def _invalid(s: AnthropicStandIn, record: RequestRecord, problems: list[str]) -> Response:
    for problem in problems:
        s._violation(record, problem)
    return _error(record, 400, "invalid_request_error", problems[0])


def _error(
    record: RequestRecord, status: int, kind: str, message: str, headers: dict[str, str] | None = None
) -> Response:
    return _answer(record, status, {"type": "error", "error": {"type": kind, "message": message}}, headers)


def _answer(
    record: RequestRecord, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None
) -> Response:
    record.status, record.response = status, payload
    return JSONResponse(
        payload, status_code=status, headers={"request-id": f"req_{record.number:024d}", **(headers or {})}
    )


async def _sleep(seconds: float, stopping: threading.Event) -> None:
    """Waits out a slow reply, but not past the stand-in's shutdown."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not stopping.is_set() and (left := deadline - loop.time()) > 0:
        await asyncio.sleep(min(left, 0.05))
