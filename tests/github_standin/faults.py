"""Injected failures: the answers GitHub gives on a bad day, armed by a test for requests that
match a method and a path pattern, a given number of times.

Kinds: "502" (GitHub's HTML error page), "timeout" (hold the answer `seconds`, then 502),
"secondary" (403 secondary rate limit with Retry-After), "ratelimit" (403 primary limit with
x-ratelimit-remaining 0 and a reset a second away), "429". With `apply_first` the request is
carried out before the failure is answered: the write happened, the client saw an error.
"""

from __future__ import annotations

import math
import re
import threading
import time
from dataclasses import dataclass

from starlette.responses import JSONResponse, Response

KINDS = ("502", "timeout", "secondary", "ratelimit", "429")
DOCS = "https://docs.github.com/rest/using-the-rest-api/rate-limits-for-the-rest-api"
UNICORN = (
    "<!DOCTYPE html>\n<html><head><title>Server Error &middot; GitHub</title></head>"
    "<body><h1>Whoa there!</h1><p>We had issues producing the response to your request.</p>"
    "<p>Sorry about that. Please try refreshing and contact us if the problem persists.</p></body></html>\n"
)


@dataclass
class Fault:
    method: str
    pattern: re.Pattern[str]
    kind: str
    times: int
    apply_first: bool
    seconds: float


class Faults:
    def __init__(self) -> None:
        self._armed: list[Fault] = []
        self._lock = threading.Lock()

    def inject(
        self, method: str, path_regex: str, kind: str, times: int = 1, apply_first: bool = False, seconds: float = 2.0
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; choose one of {', '.join(KINDS)}")
        with self._lock:
            self._armed.append(Fault(method.upper(), re.compile(path_regex), kind, times, apply_first, seconds))

    def take(self, method: str, path: str) -> Fault | None:
        """The first armed fault matching this request, spending one of its times."""
        with self._lock:
            for fault in self._armed:
                if fault.method in (method, "*") and fault.pattern.search(path):
                    fault.times -= 1
                    if fault.times <= 0:
                        self._armed.remove(fault)
                    return fault
        return None

    def clear(self) -> None:
        with self._lock:
            self._armed.clear()


def answer(fault: Fault, rate_headers: dict[str, str]) -> Response:
    """The response a fault stands for (the gateway has already held it for "timeout")."""
    if fault.kind in ("502", "timeout"):
        return Response(UNICORN, status_code=502, media_type="text/html; charset=utf-8")
    if fault.kind == "ratelimit":
        headers = {
            **rate_headers,
            "x-ratelimit-remaining": "0",
            "x-ratelimit-used": rate_headers.get("x-ratelimit-limit", "5000"),
            "x-ratelimit-reset": str(math.ceil(time.time()) + 1),
        }  # at least a second away
        body = {
            "message": "API rate limit exceeded for installation. If you reach out to GitHub Support for "
            "help, please include the request ID.",
            "documentation_url": DOCS,
            "status": "403",
        }
        return JSONResponse(body, status_code=403, headers=headers)
    status = 403 if fault.kind == "secondary" else 429
    body = {
        "message": "You have exceeded a secondary rate limit. Please wait a few minutes before you try again. "
        "If you reach out to GitHub Support for help, please include the request ID.",
        "documentation_url": DOCS,
        "status": str(status),
    }
    return JSONResponse(body, status_code=status, headers={**rate_headers, "retry-after": "1"})
