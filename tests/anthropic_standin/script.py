"""What "Claude" says: the replies a test scripts, one per Messages request, in order.

A `Reply` is either an assistant message (content blocks and a stop reason) or an API error (a
status, an error type, a message and headers). A script entry may also be a callable that gets the
parsed request body and returns a Reply, for answers that depend on what the bot sent.

    Reply.text("Lowering the learning rate.")
    Reply.tool_use("str_replace_based_edit_tool", {"command": "view", "path": "train.py"})
    Reply(blocks=[text_block("Two edits."), tool_use_block("edit", {...}), tool_use_block("edit", {...})])
    Reply.rate_limited(retry_after_s=0.01)      # 429 the SDK retries after 10 ms
    Reply.error(529)                            # overloaded_error, retried with the SDK's backoff
    Reply.text("late", delay_s=2.0)             # answers after two seconds (timeouts, pipelining)
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# anthropic.types.StopReason
STOP_REASONS = (
    "end_turn",
    "max_tokens",
    "stop_sequence",
    "tool_use",
    "pause_turn",
    "refusal",
    "model_context_window_exceeded",
)

# the API's error types by status (https://docs.claude.com/en/api/errors)
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
ERROR_MESSAGES = {
    "invalid_request_error": "Invalid request.",
    "authentication_error": "invalid x-api-key",
    "billing_error": "Your credit balance is too low to access the Anthropic API.",
    "permission_error": "Your API key does not have permission to use the specified resource.",
    "not_found_error": "Not found",
    "request_too_large": "Request exceeds the maximum allowed size.",
    "rate_limit_error": "Number of request tokens has exceeded your per-minute rate limit.",
    "api_error": "Internal server error",
    "timeout_error": "Request timed out.",
    "overloaded_error": "Overloaded",
}


def text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def tool_use_block(name: str, input: dict[str, Any], id: str | None = None) -> dict[str, Any]:
    """A tool_use block; without `id` the stand-in gives it a fresh `toolu_...` id when served."""
    return {"type": "tool_use", "id": id, "name": name, "input": input}


@dataclass
class Reply:
    blocks: list[dict[str, Any]] = field(default_factory=list)
    stop_reason: str | None = None  # None: "tool_use" when a block is a tool_use, else "end_turn"
    stop_sequence: str | None = None
    delay_s: float = 0.0
    status: int = 200
    error_type: str | None = None
    message: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status == 200:
            if self.stop_reason is None:
                uses_tool = any(b.get("type") == "tool_use" for b in self.blocks)
                self.stop_reason = "tool_use" if uses_tool else "end_turn"
            if self.stop_reason not in STOP_REASONS:
                raise ValueError(
                    f"stop_reason {self.stop_reason!r} is not one the API sends; "
                    f"choose one of {', '.join(STOP_REASONS)}"
                )
            if self.stop_reason == "stop_sequence" and not self.stop_sequence:
                raise ValueError("a stop_reason of 'stop_sequence' needs the stop_sequence that was hit")
        elif self.error_type is None:
            self.error_type = ERROR_TYPES.get(self.status, "api_error")

    @property
    def is_error(self) -> bool:
        return self.status != 200

    @classmethod
    def text(cls, text: str, *, stop_reason: str = "end_turn", delay_s: float = 0.0) -> Reply:
        return cls([text_block(text)], stop_reason=stop_reason, delay_s=delay_s)

    @classmethod
    def tool_use(
        cls, name: str, input: dict[str, Any], id: str | None = None, *, text: str | None = None, delay_s: float = 0.0
    ) -> Reply:
        """One tool call (after an optional sentence of text, as Claude usually writes one)."""
        blocks = ([text_block(text)] if text else []) + [tool_use_block(name, input, id)]
        return cls(blocks, stop_reason="tool_use", delay_s=delay_s)

    @classmethod
    def error(
        cls,
        status: int,
        type: str | None = None,
        message: str | None = None,
        headers: dict[str, str] | None = None,
        *,
        delay_s: float = 0.0,
    ) -> Reply:
        """An API error: `type` defaults from the status (429 rate_limit_error, 529 overloaded_error,
        500 api_error, 401 authentication_error, ...) and `message` from the type."""
        if status < 400:
            raise ValueError(f"an error reply needs a 4xx or 5xx status, not {status}")
        kind = type or ERROR_TYPES.get(status, "api_error")
        return cls(
            status=status,
            error_type=kind,
            message=message or ERROR_MESSAGES.get(kind, kind),
            headers=dict(headers or {}),
            delay_s=delay_s,
        )

    @classmethod
    def rate_limited(cls, retry_after_s: float = 0.01, message: str | None = None) -> Reply:
        """A 429 asking to wait `retry_after_s`: `retry-after` in whole seconds as the API sends it,
        and `retry-after-ms`, which the SDK reads first, so tests need not wait a whole second."""
        headers = {
            "retry-after": str(max(1, math.ceil(retry_after_s))),
            "retry-after-ms": str(max(1, round(retry_after_s * 1000))),
        }
        return cls.error(429, "rate_limit_error", message, headers)


Entry = Reply | Callable[[dict[str, Any]], Reply]


class Script:
    """The queue of replies. Each Messages request that reaches "the model" takes the next one: each
    attempt counts, so an SDK retry after a scripted 429 or a timeout takes the entry after it."""

    def __init__(self, entries: list[Entry]) -> None:
        for entry in entries:
            _check_entry(entry)
        self._entries = list(entries)
        self._lock = threading.Lock()
        self.taken = 0

    def add(self, *entries: Entry) -> None:
        for entry in entries:
            _check_entry(entry)
        with self._lock:
            self._entries.extend(entries)

    @property
    def remaining(self) -> int:
        with self._lock:
            return len(self._entries)

    def take(self, body: dict[str, Any]) -> tuple[int, Reply] | None:
        """(the entry's position in the script, its Reply), or None when the script has ended."""
        with self._lock:
            if not self._entries:
                return None
            entry = self._entries.pop(0)
            self.taken += 1
            position = self.taken
        reply = entry if isinstance(entry, Reply) else entry(body)
        if not isinstance(reply, Reply):
            raise TypeError(f"script entry #{position} returned {type(reply).__name__}, not a Reply")
        return position, reply


def _check_entry(entry: object) -> None:
    if not isinstance(entry, Reply) and not callable(entry):
        raise TypeError(f"a script entry is a Reply or a callable(request_body) -> Reply, not {entry!r}")


def edit_then_submit(
    new_line: Callable[[int], str], *, delay_s: float = 0.0, anchor: str = "h = harness.session()"
) -> Callable[[dict[str, Any]], Reply]:
    """A model that proposes in two turns: first an edit of train.py adding `new_line(n)` after
    `anchor` (n counts the proposals from 1, so each is new), then, once the edit's result is back,
    `submit`. Every answer comes after `delay_s` (a slow model)."""
    count = 0

    def reply(body: dict[str, Any]) -> Reply:
        nonlocal count
        last = body["messages"][-1]["content"]
        if not (isinstance(last, list) and any(b.get("type") == "tool_result" for b in last)):
            count += 1
            return Reply.tool_use(
                "str_replace_based_edit_tool",
                {
                    "command": "str_replace",
                    "path": "/repo/train.py",
                    "old_str": anchor,
                    "new_str": f"{anchor}\n{new_line(count)}",
                },
                delay_s=delay_s,
            )
        return Reply.tool_use(
            "submit",
            {"title": f"proposal {count}", "hypothesis": "a change", "expected_effect": "none", "risk": "none"},
            delay_s=delay_s,
        )

    return reply
