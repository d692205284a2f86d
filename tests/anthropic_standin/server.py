"""AnthropicStandIn: the Messages API on loopback, answering from a script, for tests that drive
the real `anthropic` SDK.

It owns the lifecycle (uvicorn in a background thread on a free port: loopback.py), the knobs a
test turns (the script, the API key, the cache's minimum and its clock), and what a test reads back
(every request, the violations of the API's rules, the prompt's text).

    with AnthropicStandIn([Reply.tool_use("str_replace_based_edit_tool", {...}), Reply.text("Done.")]) as api:
        client = anthropic.Anthropic(api_key=api.api_key, base_url=api.base_url, max_retries=0)
        ...
        assert "val_bpb" in api.last_system_text()
        assert api.violations == []
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from typing import Any, Self

from loopback import LoopbackServer

from . import app as api
from .app import RequestRecord
from .script import Entry, Reply, Script
from .tokens import PromptCache


class FakeClock:
    """The cache's clock: time moves only when a test calls advance()."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class AnthropicStandIn:
    def __init__(
        self,
        replies: Iterable[Reply | Callable[[dict[str, Any]], Reply]] = (),
        *,
        api_key: str = "sk-ant-test",
        min_cache_tokens: int = 1024,
        clock: Callable[[], float] | None = None,
    ):
        """`replies` answer the Messages requests in order (a callable gets the request body and
        returns the Reply); `min_cache_tokens` is the shortest prefix the cache keeps (1024 for
        Sonnet- and Opus-class models, 2048 or 4096 for Haiku); `clock` (seconds) times cache
        entries, a FakeClock at 0 unless given."""
        self.api_key = api_key
        self.script = Script(list(replies))
        self.clock = clock if clock is not None else FakeClock()
        self.cache = PromptCache(self.clock, min_cache_tokens)
        self._records: list[RequestRecord] = []
        self._violations: list[str] = []
        self._ids = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: LoopbackServer | None = None

    # lifecycle ------------------------------------------------------------------------------

    def start(self) -> Self:
        self._server = LoopbackServer(name="anthropic-standin-uvicorn")
        self._server.start(api.build(self))
        return self

    def stop(self) -> None:
        self._stopping.set()  # slow replies still being held give up at once
        if self._server is not None:
            self._server.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        """For anthropic.Anthropic(base_url=...): the SDK appends /v1/messages itself."""
        if self._server is None:
            raise RuntimeError("start the stand-in first (use it as a context manager)")
        return self._server.base_url

    # knobs ----------------------------------------------------------------------------------

    def add(self, *replies: Entry) -> None:
        """More replies at the end of the script."""
        self.script.add(*replies)

    @property
    def remaining(self) -> int:
        """Replies not yet used."""
        return self.script.remaining

    def advance(self, seconds: float) -> None:
        """Moves the cache's FakeClock (entries live 300 s, or 3600 s with ttl "1h")."""
        if not isinstance(self.clock, FakeClock):
            raise TypeError("advance() moves the default FakeClock; this stand-in was given another clock")
        self.clock.advance(seconds)

    # what a test reads back -----------------------------------------------------------------

    @property
    def requests(self) -> list[RequestRecord]:
        """Every request received, count_tokens and refused ones included, in arrival order."""
        with self._lock:
            return list(self._records)

    @property
    def calls(self) -> int:
        """How many POST /v1/messages requests arrived (each SDK retry is one more)."""
        return len(self.message_requests)

    @property
    def message_requests(self) -> list[RequestRecord]:
        return [r for r in self.requests if r.path == "/v1/messages"]

    @property
    def last_request(self) -> RequestRecord:
        records = self.message_requests
        if not records:
            raise LookupError("the stand-in has received no Messages request yet")
        return records[-1]

    @property
    def violations(self) -> list[str]:
        with self._lock:
            return list(self._violations)

    def take_violations(self) -> list[str]:
        """The violations so far, forgetting them (for tests that provoke one on purpose)."""
        with self._lock:
            taken, self._violations = self._violations, []
        return taken

    def last_system_text(self) -> str:
        return system_text(self.last_request.body)

    def all_text(self, request: RequestRecord | dict[str, Any] | None = None) -> str:
        """Every piece of text in a request's prompt (the last Messages request by default): system,
        tool names and descriptions, message text, tool inputs as JSON, tool results, thinking."""
        body = self.last_request.body if request is None else request
        return all_text(body.body if isinstance(body, RequestRecord) else body)

    # for the app ----------------------------------------------------------------------------

    def _log(self, path: str, headers: dict[str, str], body: Any) -> RequestRecord:
        with self._lock:
            record = RequestRecord(len(self._records) + 1, path, headers, body)
            self._records.append(record)
        return record

    def _violation(self, record: RequestRecord, problem: str) -> None:
        with self._lock:
            self._violations.append(f"request #{record.number} {record.path}: {problem}")

    def _new_id(self, prefix: str) -> str:
        with self._lock:
            self._ids += 1
            return f"{prefix}_{self._ids:024d}"


def system_text(body: dict[str, Any] | None) -> str:
    system = (body or {}).get("system")
    if isinstance(system, str):
        return system
    return "\n".join(b.get("text", "") for b in system or [] if isinstance(b, dict))


def all_text(body: dict[str, Any] | None) -> str:
    body = body or {}
    parts = [system_text(body)]
    for tool in body.get("tools") or []:
        parts += [str(tool.get("name", "")), str(tool.get("description", ""))]
    for message in body.get("messages") or []:
        content = message.get("content")
        for block in [content] if isinstance(content, str) else content or []:
            parts.append(_block_text(block))
    return "\n".join(p for p in parts if p)


def _block_text(block: Any) -> str:
    if isinstance(block, str):
        return block
    if not isinstance(block, dict):
        return ""
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind == "thinking":
        return str(block.get("thinking", ""))
    if kind == "tool_use":
        return f"{block.get('name', '')} {json.dumps(block.get('input', {}), ensure_ascii=False)}"
    if kind == "tool_result":
        content = block.get("content", "")
        if isinstance(content, str):
            return content
        return "\n".join(_block_text(b) for b in content or [])
    return ""
